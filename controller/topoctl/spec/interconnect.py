"""Intra-host interconnects: the link a host's devices share among themselves (NVLink, PCIe,
or the loopback the lab's ranks use), with datasheet defaults per kind and per device type.

Bandwidths are per device and per direction, in bytes/s (the nominal figure; the simulator
takes it as the device's port into the host's switch: NVSwitch, a PCIe root complex or the
kernel's loopback). Sources (docs/multidevice.md "Devices in a host"):

- NVLink 1 (P100 SXM2): 160 GB/s total per GPU, 80 GB/s per direction (NVIDIA Tesla P100
  datasheet);
- NVLink 2 (V100 SXM2): 300 GB/s total, 150 GB/s per direction (NVIDIA V100 datasheet);
- NVLink 3 (A100 SXM4): 600 GB/s total, 300 GB/s per direction (NVIDIA A100 datasheet);
- NVLink 4 (H100 SXM5): 900 GB/s total, 450 GB/s per direction (NVIDIA H100 datasheet);
- PCIe 3.0 / 4.0 / 5.0 x16: 8 / 16 / 32 GT/s x 16 lanes, 128b/130b: 15.75 / 31.5 / 63 GB/s
  per direction (PCI-SIG base specifications);
- loopback: the lab's `cpu` hosts run their ranks in one network namespace, talking gloo over
  `lo`; its rate is the CPU's copy rate, not a wire's. 2 GB/s and 20 us are a conservative
  figure for one gloo TCP connection on a shared 2-core VM; a cluster file may state its own.

Latencies are per message, one way: about 1-2 us for NVLink and PCIe peer copies
(nccl-tests small-message latency), tens of us for TCP over loopback.

Pure data and lookups: no I/O, nothing from the planner."""

from __future__ import annotations

from typing import NamedTuple


class LinkSpec(NamedTuple):
    """An intra-host interconnect: `bandwidth` bytes/s per device per direction, `latency` s."""

    kind: str
    bandwidth: float
    latency: float


KINDS: dict[str, LinkSpec] = {k.kind: k for k in (
    LinkSpec("nvlink1", 80e9, 2e-6),
    LinkSpec("nvlink2", 150e9, 2e-6),
    LinkSpec("nvlink3", 300e9, 2e-6),
    LinkSpec("nvlink4", 450e9, 2e-6),
    LinkSpec("pcie3", 15.75e9, 3e-6),
    LinkSpec("pcie4", 31.5e9, 3e-6),
    LinkSpec("pcie5", 63e9, 3e-6),
    LinkSpec("loopback", 2e9, 20e-6),
)}

# the interconnect a device type comes with when the cluster file does not say: the SXM part's
# NVLink for the datacenter GPUs, PCIe 3 for the P100 (the PCIe card whose figures the built-in
# table holds), loopback for the lab's `cpu` hosts; other types (a cluster's own gpu_types)
# default to PCIe 4
DEVICE_LINK: dict[str, str] = {"P100": "pcie3", "V100": "nvlink2", "A100": "nvlink3",
                               "H100": "nvlink4", "cpu": "loopback", "CPU": "loopback"}
DEFAULT_KIND = "pcie4"


def default_link(device_type: str) -> LinkSpec:
    """The datasheet interconnect of `device_type` (`DEVICE_LINK`, else PCIe 4)."""
    return KINDS[DEVICE_LINK.get(device_type, DEFAULT_KIND)]


def resolve_link(device_type: str, kind: str | None, bandwidth_bits: float | None,
                 latency: float | None) -> LinkSpec:
    """A host's interconnect: the stated `kind` (else the device type's default), its
    bandwidth overridden by `bandwidth_bits` (bit/s, as cluster files give rates) and its
    latency by `latency` (seconds) when stated."""
    base = KINDS[kind] if kind is not None else default_link(device_type)
    return LinkSpec(base.kind,
                    base.bandwidth if bandwidth_bits is None else bandwidth_bits / 8.0,
                    base.latency if latency is None else latency)
