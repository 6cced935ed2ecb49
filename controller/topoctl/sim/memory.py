"""Memory a training device holds: the model state (parameters, gradients, optimiser state),
sharded or not, and the activations kept for the backward pass, with or without
recomputation.

The accounting of ZeRO (Rajbhandari et al., SC'20): per parameter, the weights and the
gradients in the training dtype, plus the optimiser's state (Adam: two fp32 moments, 8 bytes;
with mixed precision also an fp32 master copy, 4 bytes: 16 bytes per parameter in all for
fp16/bf16 training, as for fp32 training with Adam). Tensor parallelism of degree t divides
the sharded layers' state by t; FSDP (ZeRO-3) over d ranks divides all of it by d and adds
the largest unit gathered at once (two with prefetching); ZeRO-1/2 shard the optimiser state,
then the gradients. Activations: what the forward keeps for the backward at the local batch,
times the micro-batches in flight (GPipe keeps all); with recomputation only each block's
input is kept, plus one block's activations while it is recomputed (Chen et al. 2016).
Pure arithmetic, O(1)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OPTIMISER_BYTES", "Footprint", "footprint", "format_gb", "overflow"]

# optimiser state bytes per parameter (fp32 moments); a master copy adds 4 under mixed precision
OPTIMISER_BYTES = {"sgd": 0, "momentum": 4, "adam": 8, "adamw": 8}


@dataclass(frozen=True)
class Footprint:
    """Bytes one device holds, by kind."""

    parameters: float
    gradients: float
    optimiser: float
    activations: float
    gathered: float = 0.0  # FSDP: full parameters of the units gathered at once

    @property
    def total(self) -> float:
        """All of it."""
        return (self.parameters + self.gradients + self.optimiser + self.activations
                + self.gathered)

    def describe(self) -> str:
        """'212.0 GB (parameters 26.0 GB, gradients 26.0 GB, ...)': the kinds that are not 0."""
        parts = [(k, getattr(self, k)) for k in ("parameters", "gradients", "optimiser",
                                                 "activations", "gathered")]
        inner = ", ".join(f"{k} {format_gb(v)}" for k, v in parts if v)
        return f"{format_gb(self.total)} ({inner})"


def format_gb(nbytes: float) -> str:
    """Bytes with 3 significant figures in GB (1 GB = 1e9 bytes, as datasheets count), in MB
    below a GB and kB below a MB (1.57 MB, not 0.00157 GB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= 0.9995 * scale:  # 999.96 MB reads 1 GB, not 1e+03 MB
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.3g} B"


def footprint(parameters: float, dtype_bytes: int, activation_bytes: float, *,
              optimiser: str = "adam", mixed_precision: bool = False, tensor: int = 1,
              shard: int = 1, zero: int = 0, microbatches: int = 1,
              recompute_bytes: float | None = None, largest_unit: int = 0,
              prefetch: int = 1) -> Footprint:
    """The footprint of one device training `parameters` parameters of `dtype_bytes` bytes.

    `activation_bytes`: activations the forward keeps at the device's micro-batch (already
    divided by `tensor` where the layers are split); `recompute_bytes`: with recomputation,
    the block inputs kept plus one block's activations (replaces `activation_bytes`).
    `tensor`: tensor-parallel degree; `shard` and `zero`: the data-parallel ranks sharing the
    state and how much of it (0 none, 1 optimiser, 2 + gradients, 3 + parameters = FSDP);
    `largest_unit`: parameters of FSDP's largest unit, gathered `1 + prefetch` at a time."""
    if optimiser not in OPTIMISER_BYTES:
        raise ValueError(f"optimiser {optimiser!r} is not one of {', '.join(OPTIMISER_BYTES)}")
    per_device = parameters / tensor
    opt = OPTIMISER_BYTES[optimiser] + (4 if mixed_precision and dtype_bytes < 4 else 0)
    weights = per_device * dtype_bytes / (shard if zero >= 3 else 1)
    grads = per_device * dtype_bytes / (shard if zero >= 2 else 1)
    state = per_device * opt / (shard if zero >= 1 else 1)
    acts = (recompute_bytes if recompute_bytes is not None else activation_bytes) * microbatches
    gathered = (1 + prefetch) * largest_unit / tensor * dtype_bytes if zero >= 3 else 0.0
    return Footprint(weights, grads, state, acts, gathered)


def overflow(need: dict[str, Footprint], capacity: dict[str, float | None],
             kind: dict[str, str]) -> list[str]:
    """One sentence per device whose footprint exceeds its memory: the device, what it needs
    (by kind), what it has. Devices of unknown capacity (None) are not checked."""
    out = []
    for dev, fp in need.items():
        cap = capacity.get(dev)
        if cap is not None and fp.total > cap:
            out.append(f"{dev} ({kind.get(dev, 'device')}, {format_gb(cap)}): needs "
                       f"{fp.describe()}, has {format_gb(cap)}")
    return out
