"""The lab machine as the planner's cost models see it: one typed value, `LabProfile`.

The namespace lab (`topoctl.lab`, docs/lab.md) runs every training rank of a plan on one
machine. What that costs is a property of the machine and of how the lab builds its cables,
not of any algorithm: how many cores the ranks share, what the cable emulation (veth pairs,
tc HTB shaping, the endpoints' TCP) costs per wire byte, how much token credit a shaped cable
has after idling, how many bytes a socket's send buffer takes, and the TCP congestion control
the figures were measured under. They used to be module constants and reads of the machine
inside the planner and the cost models; now `machine_profile` reads them once at the edge
(`planner.prepare`, or a caller that passes its own profile), `PlanContext.lab` carries the
result, and the algorithms (`collective.trees.pipeline`, `placement.runtime`, the
strategies) take it as a parameter.

The defaults are the figures of the 2-core AMD EPYC VM the lab was measured on (2026-11),
used for `--no-cache` plans so that they do not depend on the machine that plans them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from topoctl.lab.commands import BURST_S, cable_credit_s
from topotrain.timing import TCP_CONGESTION, load_calibration

__all__ = ["DEFAULT_LAB", "LabProfile", "machine_profile", "profile_from_calibration",
           "tcp_send_buffer"]

# the lab's cable emulation (veth pairs, tc HTB shaping) with the endpoints' TCP work (the lab
# hosts' cubic): wire bytes per core-second, fitted to the whole machine's CPU during the
# lock-step tree AllReduce of 15.9 MB on tworack8 and hetero8 at 16-137 KB chunks (the
# Intel Xeon: 0.60 fits hetero8, 0.65 tworack8, within 6%;
# bench/results/emulation-cost-2026-11-26.md; kept on the AMD VM,
# bench/results/emulation-cost-2026-11-27-amd.md). The earlier 0.51 came from iperf3 under
# BBR, whose timer pacing costs CPU; iperf3's own pacing at 56 low rates costs CPU too.
DEFAULT_EMULATION_BYTES_PER_S = 0.62e9
DEFAULT_CORES = 2  # the VM the defaults were measured on
# the most a TCP socket's send buffer grows to (the third field of net.ipv4.tcp_wmem): Linux's
# default (tcp(7): 4 MB unless memory is small), this machine's when read (`tcp_send_buffer`)
TCP_WMEM = "/proc/sys/net/ipv4/tcp_wmem"
DEFAULT_SEND_BUFFER = 4 * 1024 * 1024


@dataclass(frozen=True)
class LabProfile:
    """The lab machine's facts the cost models use (module docstring). Frozen: one profile is
    built per plan and shared by every strategy.

    - ``cores``: cores every lab rank shares (the simulator's ``Network.cpu_pool``, the tree
      runtime's CPU part stretched over them, the co-running copies a rank is timed beside);
    - ``emulation_bytes_per_s``: wire bytes per core-second of the cable emulation, counted at
      both ends as iperf3 measures it (a byte sent and received costs ``2 /`` this);
    - ``burst_s``: token credit of a shaped cable in seconds at its rate
      (``topoctl.lab.commands.BURST_S``), spent by the first messages after the cable idled;
    - ``send_buffer_bytes``: the most a lab rank's TCP socket holds of a message it sends
      (the maximum of ``net.ipv4.tcp_wmem``, which a lab namespace copies from the machine
      when it is made: gloo leaves the buffer to the kernel's autotuning, which grows a
      long-lived connection's buffer up to it); a send returns once the rest fits in it
      (``sim.tasks.Transfer.buffer``);
    - ``tcp_congestion``: the lab hosts' congestion control, under which the figures above and
      the runtime's calibration were measured (``topotrain.timing.TCP_CONGESTION``);
    - ``source``: where the figures came from (``default``, ``machine``, ``calibrated:<key>``).
    """

    cores: int = DEFAULT_CORES
    emulation_bytes_per_s: float = DEFAULT_EMULATION_BYTES_PER_S
    burst_s: float = BURST_S
    send_buffer_bytes: int = DEFAULT_SEND_BUFFER
    tcp_congestion: str = TCP_CONGESTION
    source: str = "default"

    def wire_rate(self, wire_bytes_per_s: float) -> float:
        """Wire bytes per core-second a lab rank moves when its runtime alone moves
        `wire_bytes_per_s`: every byte also costs the cable emulation, half at each end
        (``min(wire_bytes_per_s, 2 * emulation_bytes_per_s)``)."""
        return min(wire_bytes_per_s, 2 * self.emulation_bytes_per_s)

    def cable_credit_s(self, rate: float, mtu: int) -> float:
        """Seconds of token credit, at its rate, of a lab cable shaped to `rate` bit/s with
        frames of `mtu` bytes: the lab's shaping rule (``topoctl.lab.commands.cable_credit``)
        with this profile's ``burst_s``."""
        return cable_credit_s(rate, mtu, self.burst_s)


DEFAULT_LAB = LabProfile()  # the defaults, for pure functions called without a profile


def profile_from_calibration(calibration: dict[str, Any] | None,
                             fallback_cores: int = DEFAULT_CORES) -> LabProfile:
    """The profile a runtime calibration document describes
    (``topotrain.timing.load_calibration()``: its ``cores`` and, when it has one, its
    ``emulation_bytes_per_s``), or the defaults with `fallback_cores` when there is none."""
    if not calibration:
        return LabProfile(cores=fallback_cores,
                          source="default" if fallback_cores == DEFAULT_CORES
                          else "machine")
    return LabProfile(
        cores=int(calibration.get("cores") or fallback_cores),
        emulation_bytes_per_s=float(calibration.get("emulation_bytes_per_s",
                                                    DEFAULT_EMULATION_BYTES_PER_S)),
        source=f"calibrated:{calibration.get('key', '?')}",
    )


def tcp_send_buffer(path: str = TCP_WMEM) -> int:
    """The most a TCP socket's send buffer grows to on this machine: the third field of
    ``net.ipv4.tcp_wmem`` (`path`); the default when it cannot be read."""
    try:
        with open(path) as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return DEFAULT_SEND_BUFFER


def machine_profile(use_cache: bool = True) -> LabProfile:
    """The profile of the machine this process runs on: the one place that reads it. With
    `use_cache`, the runtime calibration's figures (``python -m
    topotrain.collectives.calibrate``), else ``os.cpu_count()`` cores and the default
    emulation cost, and this machine's TCP send buffer (`tcp_send_buffer`); without, the
    defaults (plans that do not depend on this machine)."""
    if not use_cache:
        return LabProfile()
    return replace(profile_from_calibration(load_calibration(), os.cpu_count() or 1),
                   send_buffer_bytes=tcp_send_buffer())
