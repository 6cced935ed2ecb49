"""List-scheduling heuristic (HEFT, Topcuoglu, Hariri and Wu, IEEE TPDS 2002) for placement.

Nodes in decreasing upward rank (mean cost + mean communication to the end); each goes to the
device that minimises the objective so far, max(makespan, EFT on d) + (microbatches - 1) *
max(bottleneck, load(d) + cost), among devices with memory left; ties go to the earliest
finish (with one micro-batch this is HEFT's earliest-finish-time rule, without insertion into
idle gaps). The balanced contiguous partition (`partition.place`) and the best single device
are candidates too, and the best of the three under the shared objective is returned, so the
result is never worse than either baseline. No approximation guarantee exists for HEFT with
communication on heterogeneous devices; `problem.lower_bound` bounds the optimum from below
and the tests check the gap on small instances against the MILP.
O(n * D + E) for HEFT, O(D * n^2) for the partition.
"""

from __future__ import annotations

from topoctl.placement import partition
from topoctl.placement.problem import (
    Placement,
    PlacementError,
    PlacementProblem,
    evaluate,
    priority_order,
    serial,
)


def heft(p: PlacementProblem) -> Placement:
    """The list-scheduling pass alone (see module docstring)."""
    p.check()
    n, dv = len(p.nodes), len(p.devices)
    order = priority_order(p)
    preds = p.preds()
    free = [0.0] * dv
    load = [0.0] * dv
    mem = [0.0] * dv
    finish = [0.0] * n
    assign = [-1] * n
    span = bneck = 0.0
    m1 = p.microbatches - 1
    for i in order:
        best = None
        for d in range(dv):
            if mem[d] + p.memory[i] > p.capacity[d]:
                continue
            ready = max((finish[q] + p.comm(p.edges[(q, i)], assign[q], d) for q in preds[i]),
                        default=0.0)
            eft = max(free[d], ready) + p.cost[i][d]
            score = max(span, eft) + m1 * max(bneck, load[d] + p.cost[i][d])
            key = (score, eft, d)
            if best is None or key < best:
                best = key
        if best is None:
            raise PlacementError(f"{p.nodes[i]} ({p.memory[i] / 1e9:.3g} GB) fits on no device "
                                 "once the nodes before it are placed")
        _, eft, d = best
        assign[i], finish[i], free[d] = d, eft, eft
        load[d] += p.cost[i][d]
        mem[d] += p.memory[i]
        span, bneck = max(span, eft), max(bneck, load[d])
    return evaluate(p, assign, order, algorithm="heft")


def candidates(p: PlacementProblem) -> list[Placement]:
    """HEFT, the contiguous partition and the best single device, those that fit the devices'
    memory; PlacementError (every reason) when none does."""
    cands: list[Placement] = []
    errors: list[str] = []
    for fn in (heft, partition.place):
        try:
            cands.append(fn(p))
        except PlacementError as e:
            errors.append(str(e))
    one = serial(p)
    if one is not None:
        cands.append(one)
    if not cands:
        raise PlacementError("; ".join(dict.fromkeys(errors)))
    return cands


def place(p: PlacementProblem) -> Placement:
    """Best of HEFT, the contiguous partition and the best single device."""
    cands = candidates(p)
    best = min(cands, key=lambda c: (c.objective, c.algorithm))
    info = {c.algorithm: c.objective for c in cands}
    return Placement(best.assign, best.objective, best.makespan, best.bottleneck, best.start,
                     "heuristic", None, {"candidates": info, "chosen": best.algorithm})
