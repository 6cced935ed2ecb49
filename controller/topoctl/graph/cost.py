"""Per-op cost: a device-type roofline (Williams et al., CACM'09) or timings measured on this CPU.

`roofline_costs`: t = launch + max(FLOPs / (eff * peak), bytes / (eff * mem_bw)) per op, forward
and backward (backward bytes ~ 2x forward: read activations and gradients, write both); views
cost 0. O(ops).
`measure_costs`: a timed fx Interpreter on real tensors (warm-up runs, then the median of
`repeats` runs per node); backward estimated as the forward time scaled by the op's FLOP ratio
(2x for ops with weights, 1x otherwise), as TAG and FlexFlow do when only forward is profiled.
Measuring is I/O-free but not pure (it runs the model); its results are cached by
`graph.cache`."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import fx, nn

from topoctl.graph.devices import Device
from topoctl.graph.ops import OpGraph


@dataclass(frozen=True)
class OpCost:
    """Seconds one op takes forward and backward."""

    fwd: float  # seconds
    bwd: float


def roofline_costs(graph: OpGraph, device: Device, dtype: str = "float32") -> dict[str, OpCost]:
    """Per-op forward/backward seconds on `device` by the roofline model (views cost nothing)."""
    peak = device.peak(dtype) * device.efficiency
    bw = device.mem_bw * device.efficiency
    out = {}
    for op in graph.ops:
        if op.is_view:
            out[op.name] = OpCost(0.0, 0.0)
            continue
        moved = op.in_bytes + op.out_bytes + op.param_bytes
        fwd = device.launch + max(op.flops / peak, moved / bw)
        bwd = device.launch + max(op.bwd_flops / peak, 2 * moved / bw)
        out[op.name] = OpCost(fwd, bwd)
    return out


class _TimedInterpreter(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.times: dict[str, list[float]] = {}

    def run_node(self, n: fx.Node):
        t0 = time.perf_counter()
        r = super().run_node(n)
        self.times.setdefault(n.name, []).append(time.perf_counter() - t0)
        return r


def measure_costs(model: nn.Module, inputs: tuple[torch.Tensor, ...], graph: OpGraph,
                  warmup: int = 1, repeats: int = 3) -> dict[str, OpCost]:
    """Time each fx node on this CPU (median of `repeats` after `warmup` runs).

    `graph` must come from capturing the same model (node names match)."""
    gm = fx.symbolic_trace(model)
    interp = _TimedInterpreter(gm)
    with torch.no_grad():
        for _ in range(warmup):
            interp.run(*inputs)
        interp.times.clear()
        for _ in range(repeats):
            interp.run(*inputs)
    out = {}
    for op in graph.ops:
        if op.is_view:
            out[op.name] = OpCost(0.0, 0.0)
            continue
        fwd = statistics.median(interp.times.get(op.name, [0.0]))
        ratio = op.bwd_flops / op.flops if op.flops else 1.0
        out[op.name] = OpCost(fwd, fwd * ratio)
    return out


def scale_costs(costs: dict[str, OpCost], factor: float) -> dict[str, OpCost]:
    """Costs for `factor` times the profiled batch (compute-bound ops scale linearly)."""
    return {k: OpCost(c.fwd * factor, c.bwd * factor) for k, c in costs.items()}


def totals(costs: dict[str, OpCost]) -> tuple[float, float]:
    """(total forward seconds, total backward seconds) of `costs`."""
    return sum(c.fwd for c in costs.values()), sum(c.bwd for c in costs.values())
