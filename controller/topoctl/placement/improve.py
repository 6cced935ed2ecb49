"""MILP improvement of a given placement: the exact MILP of `placement.milp`, solved with HiGHS
through highspy, started from a known placement (the heuristic's).

What the start buys (Wolsey, Integer Programming, ch. 7; HiGHS's `setSolution`):
- an incumbent from the first node: branch and bound prunes every subtree whose LP bound is
  not better than it, and the result is never worse than the start;
- tighter constraints: a better schedule finishes every node by `upper` (the start's
  objective), so start times and the makespan get `upper` as their bound, the disjunctive
  big-M shrinks from the sum of all costs to `upper`, and C + (microbatches - 1) L <= upper
  cuts off the rest (`milp.formulate`);
- optionally (`symmetry=True`), symmetry breaking between identical devices (same costs,
  memory and transfer times: the A100s among themselves): loads in non-increasing order
  within a class, the start permuted to satisfy it. Off by default: HiGHS detects these
  orbitopes itself, and the explicit rows made the 10-node search 1.2-2x slower on the
  bench's models (docs/placement.md).

- the compact communication rows (`milp.formulate(compact=True)`: D rows per edge instead of
  D (D - 1) when the fabric is uniform between the devices).

Search effort is deterministic: a node limit (`node_limit`), one thread, a fixed seed. HiGHS's
sub-MIP heuristics (RINS, RENS) are off and branching uses pseudo-costs without strong
branching (`mip_pscost_minreliable` 0): on the bench's coarse graphs (22-38 nodes, 4-8
devices) the sub-MIPs took half the time and strong branching half of the LP iterations,
while the start already is a good incumbent; with both off and the compact rows the 10-node
search takes 19-96 ms instead of 0.35-1.3 s, same objectives (docs/placement.md). No
wall-clock limit decides the answer: `time_limit` is only an outer safety limit, reported
when it cut the search.
"""

from __future__ import annotations

import numpy as np

from topoctl.placement.milp import Model, formulate
from topoctl.placement.problem import Placement, PlacementProblem, evaluate

try:  # highspy ships with the project's dependencies; scipy's milp has no warm start
    import highspy
except ImportError:  # pragma: no cover - exercised only without the dependency
    highspy = None

OPTIONS = {
    "output_flag": False,
    "threads": 1,
    "random_seed": 0,
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_pscost_minreliable": 0,
}


def symmetric_classes(p: PlacementProblem) -> list[list[int]]:
    """Classes (of two or more) of interchangeable devices: equal cost column, capacity and
    transfer times to and from every other device (latency included)."""
    dv = len(p.devices)

    def sig(d: int) -> tuple:
        others = [e for e in range(dv) if e != d]
        return (tuple(c[d] for c in p.cost), p.capacity[d],
                tuple(sorted((p.comm(1.0, d, e), p.comm(1.0, e, d)) for e in others)))

    # the comm signature must not depend on which other device is which: require equal
    # rows to every third device as well
    classes: list[list[int]] = []
    for d in range(dv):
        for cls in classes:
            e = cls[0]
            if sig(d) == sig(e) and all(p.comm(1.0, d, f) == p.comm(1.0, e, f) and
                                        p.comm(1.0, f, d) == p.comm(1.0, f, e)
                                        for f in range(dv) if f not in (d, e)):
                cls.append(d)
                break
        else:
            classes.append([d])
    return [c for c in classes if len(c) > 1]


def canonical(p: PlacementProblem, assign: list[int], classes: list[list[int]]) -> list[int]:
    """`assign` with identical devices renamed so that loads are non-increasing within every
    class (same objective: the devices are interchangeable)."""
    load = [0.0] * len(p.devices)
    for i, d in enumerate(assign):
        load[d] += p.cost[i][d]
    rename = {}
    for cls in classes:
        by_load = sorted(cls, key=lambda d: (-load[d], d))
        rename.update(zip(by_load, cls, strict=True))
    return [rename.get(d, d) for d in assign]


def _start_vector(p: PlacementProblem, mo: Model, pl: Placement) -> np.ndarray:
    n, dv = len(p.nodes), len(p.devices)
    v = np.zeros(len(mo.c))
    for i, d in enumerate(pl.assign):
        v[i * dv + d] = 1.0
    v[mo.s0:mo.s0 + n] = pl.start
    v[mo.c_col] = pl.makespan
    v[mo.l_col] = pl.bottleneck
    for k, (i, j) in enumerate(mo.pairs):
        v[mo.o0 + k] = 1.0 if (pl.start[i], i) < (pl.start[j], j) else 0.0
    return v


def improve(p: PlacementProblem, start: Placement, node_limit: int = 10,
            time_limit: float = 600.0, symmetry: bool = False, compact: bool = True
            ) -> Placement:
    """The MILP from `start` (module docstring); returns the better of the solver's incumbent
    (scored with `problem.evaluate`) and `start`. `info`: nodes, gap, the start's and the
    result's objectives, rows, columns. RuntimeError when highspy is missing."""
    if highspy is None:
        raise RuntimeError("highspy is not installed (pip install highspy; it is in the "
                           "project's controller dependencies)")
    p.check()
    n, dv = len(p.nodes), len(p.devices)
    classes = symmetric_classes(p) if symmetry else []
    first = evaluate(p, canonical(p, start.assign, classes), algorithm=start.algorithm)
    if first.objective > start.objective * (1 + 1e-9):  # renaming must not change it
        first, classes = evaluate(p, start.assign, algorithm=start.algorithm), []
    upper = first.objective * (1 + 1e-9)
    mo = formulate(p, upper=upper, symmetric=classes, compact=compact)
    h = highspy.Highs()
    for k, v in OPTIONS.items():
        h.setOptionValue(k, v)
    h.setOptionValue("mip_max_nodes", int(node_limit))
    h.setOptionValue("time_limit", float(time_limit))
    a = mo.a.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(mo.c), a.shape[0]
    inf = highspy.kHighsInf
    lp.col_cost_ = mo.c
    lp.col_lower_ = mo.col_lb
    lp.col_upper_ = np.minimum(mo.col_ub, inf)
    lp.row_lower_ = np.maximum(mo.row_lb, -inf)
    lp.row_upper_ = np.minimum(mo.row_ub, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    lp.integrality_ = [highspy.HighsVarType.kInteger if v else highspy.HighsVarType.kContinuous
                       for v in mo.integrality]
    h.passModel(lp)
    sol = highspy.HighsSolution()
    sol.col_value = list(_start_vector(p, mo, first))
    sol.value_valid = True
    h.setSolution(sol)
    h.run()
    info_h = h.getInfo()
    status = h.getModelStatus()
    x = np.array(h.getSolution().col_value)
    best = first
    if x.size == len(mo.c) and info_h.primal_solution_status >= 1:
        xs = x[:mo.s0].reshape(n, dv)
        assign = [int(np.argmax(xs[i])) for i in range(n)]
        s = x[mo.s0:mo.s0 + n]
        ev = evaluate(p, assign, sorted(range(n), key=lambda i: (s[i], i)), "milp")
        ev2 = evaluate(p, assign, algorithm="milp")
        ev = min((ev, ev2), key=lambda e: e.objective)
        if ev.objective < best.objective:
            best = ev
    gap = float(info_h.mip_gap) if np.isfinite(info_h.mip_gap) else None
    info = {"status": h.modelStatusToString(status), "nodes": int(info_h.mip_node_count),
            "gap": gap, "dual_bound": float(info_h.mip_dual_bound),
            "start_objective": start.objective, "objective": best.objective,
            "variables": len(mo.c), "rows": a.shape[0], "symmetric_classes": classes,
            "improved": best is not first,
            "time_limited": "time limit" in h.modelStatusToString(status).lower()}
    algo = "milp" if best is not first else start.algorithm
    return Placement(best.assign, best.objective, best.makespan, best.bottleneck, best.start,
                     algo, gap, info)
