"""Per-op costs of a job's op graph under a fusion option: what the planner's simulator and the
`disco` search (DisCo, Chen et al., TPDS) read as ``fusion_options[option]``.

`fused_costs(graph, costs, option)`: ``none`` gives `costs` unchanged; ``groups`` fuses the
regions `regions.choose_regions` picks, ``whole`` the whole model (region ""). A fused region's
forward and backward seconds are charged to its anchor, the topologically last op of the
region, and its other ops cost 0: a simulator that runs the forward in graph order and the
backward in reverse then sees the region finish when its fused program does, and every
gradient of the region ready only when the region's whole backward is done, which is what the
runtime's compiled region (one autograd node) delivers: fusion trades overlap for speed.

A region's time: on a roofline device (`device`), t = launch + max(FLOPs / peak, external
bytes / bandwidth) forward, backward with twice the bytes (as `graph.cost.roofline_costs`):
fusion removes the launches of all ops but one and the memory traffic of the tensors that stay
inside the region; never more than the eager sum. Otherwise (costs measured on this CPU), the
learned model `predict(ops, eager_s)` (default: `fitted.MODEL`, the simple launch model fitted
on the catalog's regions, better than the GNN on held-out models: docs/results.md) scales the
region's eager forward and backward alike. Pure; O(ops x regions)."""

from __future__ import annotations

from collections.abc import Callable

from topocontract.fusion import FusionPlan
from topoctl.disco.fusion.fitted import MODEL
from topoctl.disco.fusion.regions import choose_regions, op_regions, region_ops
from topoctl.graph.cost import LOOKUP_KINDS, OpCost
from topoctl.graph.devices import Device
from topoctl.graph.ops import Op, OpGraph

OPTIONS = ("none", "groups", "whole")
Predict = Callable[[list[dict], float], float]


def fusion_plan(graph: OpGraph, costs: dict[str, OpCost], option: str, parts: int = 8
                ) -> FusionPlan:
    """The plan's ``job.fusion`` for `option` (`FusionPlan.to_dict`): its regions."""
    if option not in OPTIONS:
        raise ValueError(f"fusion option {option!r}: one of {', '.join(OPTIONS)}")
    if option == "none":
        return FusionPlan()
    if option == "whole":
        return FusionPlan("whole", ("",))
    regions = choose_regions(graph, costs, parts)
    return FusionPlan("groups", regions) if regions else FusionPlan()


def fused_costs(graph: OpGraph, costs: dict[str, OpCost], option: str, *,
                regions: tuple[str, ...] | None = None, device: Device | None = None,
                dtype: str = "float32", predict: Predict | None = None
                ) -> dict[str, OpCost]:
    """Per-op costs of `graph` when `option`'s regions (or `regions`) run fused (module doc):
    every op of `costs` present, a region's cost on its anchor op."""
    if regions is None:
        regions = fusion_plan(graph, costs, option).regions
    out = dict(costs)
    member = op_regions(graph, regions)
    ops = graph.by_name()
    for region in regions:
        names = [o.name for o in graph.ops if member.get(o.name) == region]
        compute = [n for n in names if not ops[n].is_view]
        if len(compute) < 2:
            continue  # one op: nothing to fuse
        fwd = sum(costs[n].fwd for n in names if n in costs)
        bwd = sum(costs[n].bwd for n in names if n in costs)
        if device is not None:
            f_fwd, f_bwd = _roofline_region(graph, [ops[n] for n in names], device, dtype)
            f_fwd, f_bwd = min(f_fwd, fwd), min(f_bwd, bwd)
        else:
            ratio = ((predict or MODEL.predict)(region_ops(graph, region), fwd + bwd)
                     / (fwd + bwd)) if fwd + bwd > 0 else 1.0
            f_fwd, f_bwd = fwd * ratio, bwd * ratio
        for n in names:
            if n in out:  # the result has the ops of `costs`, no others
                out[n] = OpCost(0.0, 0.0)
        out[compute[-1]] = OpCost(f_fwd, f_bwd)
    return out


def fusion_options(graph: OpGraph, costs: dict[str, OpCost], **kw) -> dict[str, dict[str,
                                                                                   OpCost]]:
    """``{option: fused_costs(graph, costs, option, **kw)}`` for every option: the search's
    ``fusion_options``."""
    return {o: fused_costs(graph, costs, o, **kw) for o in OPTIONS}


def _roofline_region(graph: OpGraph, ops: list[Op], device: Device, dtype: str
                     ) -> tuple[float, float]:
    """(forward, backward) seconds of `ops` as one kernel on `device`: one launch, the FLOPs
    of all, and only the bytes that cross the region's boundary (inputs from outside, outputs
    read outside or by nobody, parameters; a lookup's gathered rows, not its table)."""
    peak = device.peak(dtype) * device.efficiency
    bw = device.mem_bw * device.efficiency
    names = {o.name for o in ops}
    sizes = {o.name: o.out_bytes for o in ops}
    read_outside = {i for o in graph.ops if o.name not in names for i in o.inputs}
    moved = 0
    for o in ops:
        if o.is_view:
            continue
        outside_in = o.in_bytes - sum(sizes[i] for i in o.inputs if i in names)
        params = 2 * o.out_bytes if o.kind in LOOKUP_KINDS else o.param_bytes
        moved += max(outside_in, 0) + params + (o.out_bytes if o.name in read_outside
                                               or o.name == ops[-1].name else 0)
    flops = sum(o.flops for o in ops)
    bwd_flops = sum(o.bwd_flops for o in ops)
    return (device.launch + max(flops / peak, moved / bw),
            device.launch + max(bwd_flops / peak, 2 * moved / bw))
