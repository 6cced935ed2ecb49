"""Device-type roofline parameters: dense peak FLOP/s per dtype and memory bandwidth.

Vendor datasheet figures (NVIDIA P100 PCIe, V100 SXM2, A100 SXM4 80GB, H100 SXM5; fp32 without
TF32, fp16 and bf16 tensor-core dense). A cluster file's `gpu_types` add entries or override
these (`graph.profile.device_table`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """A device type for the roofline: peak FLOP/s per dtype, memory bandwidth, launch cost,
    efficiency and memory size."""

    name: str
    flops: dict[str, float]  # dtype -> peak FLOP/s
    mem_bw: float  # bytes/s
    launch: float = 5e-6  # fixed cost per kernel (launch + scheduling), seconds
    efficiency: float = 0.6  # achievable fraction of the roofline on real kernels
    memory: float = 80e9  # bytes the device holds (placement's memory limit)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for `dtype` (fp32's when the dtype is not listed)."""
        return self.flops.get(dtype, self.flops["float32"])


DEVICES: dict[str, Device] = {d.name: d for d in [
    # the PCIe card of HAP's testbed (EuroSys'24): 9.3 TFLOP/s fp32, 18.7 fp16, 732 GB/s HBM2,
    # 16 GB (NVIDIA Tesla P100 PCIe datasheet)
    Device("P100", {"float32": 9.3e12, "float16": 18.7e12, "bfloat16": 9.3e12}, 732e9,
           memory=16e9),
    Device("V100", {"float32": 15.7e12, "float16": 125e12, "bfloat16": 15.7e12}, 900e9,
           memory=32e9),
    Device("A100", {"float32": 19.5e12, "float16": 312e12, "bfloat16": 312e12}, 2039e9),
    Device("H100", {"float32": 67e12, "float16": 989e12, "bfloat16": 989e12}, 3350e9),
    # a generic server CPU socket, only for rough roofline planning without a GPU
    Device("CPU", {"float32": 1e12, "float16": 0.5e12, "bfloat16": 1e12}, 100e9, 2e-6, 0.3,
           memory=64e9),
]}
