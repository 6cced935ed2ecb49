"""Exact placement by mixed-integer linear programming (the thesis's placement MILP, solved
with HiGHS through scipy.optimize.milp).

Variables: x[i, d] in {0, 1} (node i on device d), S[i] >= 0 (start), C (makespan of one
micro-batch), L (bottleneck device load, only with several micro-batches), and o[i, j] in
{0, 1} for every pair of nodes that no path orders (which of the two runs first if they share
a device). With P[i] = sum_d cost[i][d] x[i, d]:
  sum_d x[i, d] = 1                                            every node placed once
  sum_i memory[i] x[i, d] <= capacity[d]                       memory
  S[j] >= S[i] + P[i]                                          edge (i, j)
  S[j] >= S[i] + P[i] + t_ij(d, e) (x[i, d] + x[j, e] - 1)     edge (i, j), d != e: the
                                                               transfer over the route d->e
  S[j] >= S[i] + P[i] - M (3 - o - x[i, d] - x[j, d])          no overlap on a device (and
  S[i] >= S[j] + P[j] - M (2 + o - x[i, d] - x[j, d])          the other order)
  C >= S[i] + P[i];  L >= sum_i cost[i][d] x[i, d]
  minimise C + (microbatches - 1) L                            (`problem` docstring)
The per-pair communication constraints need no extra variables (D(D-1) rows per edge); pairs
where either node costs nothing cannot conflict and get no ordering variable. M = sum of the
largest costs plus the largest transfer of every edge (an upper bound on any schedule).

Determinism: HiGHS explores a fixed number of branch-and-bound nodes (`node_limit`), so the
same input gives the same answer; `time_limit` is only an outer safety limit and is reported
when it cut the search. The result carries the relative gap between the incumbent and HiGHS's
dual bound (0: proven optimal). Size: n*D + n + 2 + (unordered pairs) variables and
O(E * D^2 + pairs * D) rows; branch and bound is exponential in the worst case, which is why
the strategy runs it on the coarse graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, csr_matrix

from topoctl.placement.problem import Placement, PlacementError, PlacementProblem, evaluate


def unordered_pairs(p: PlacementProblem) -> list[tuple[int, int]]:
    """Pairs (i < j) with no path between them, both with a positive cost somewhere."""
    n = len(p.nodes)
    reach = [0] * n  # bitset of descendants
    succ = p.succs()
    for i in reversed(range(n)):
        r = 0
        for s in succ[i]:
            r |= (1 << s) | reach[s]
        reach[i] = r
    busy = [max(c) > 0 for c in p.cost]
    return [(i, j) for i in range(n) if busy[i] for j in range(i + 1, n)
            if busy[j] and not (reach[i] >> j) & 1]


class _Rows:
    """Sparse constraint rows lb <= A x <= ub, built incrementally."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, coefs: dict[int, float], lb: float, ub: float) -> None:
        k = len(self.lb)
        for col, val in coefs.items():
            if val:
                self.r.append(k)
                self.c.append(col)
                self.v.append(val)
        self.lb.append(lb)
        self.ub.append(ub)



@dataclass(frozen=True)
class Model:
    """The MILP as arrays: minimise c x subject to row_lb <= a x <= row_ub, col_lb <= x <=
    col_ub, x integral where `integrality` is 1. Columns: x[i, d] at i * D + d, S[i] at
    `s0` + i, C at `c_col`, L at `l_col`, the ordering binaries from `o0` on (`pairs`)."""

    c: np.ndarray
    a: csr_matrix
    row_lb: np.ndarray
    row_ub: np.ndarray
    col_lb: np.ndarray
    col_ub: np.ndarray
    integrality: np.ndarray
    s0: int
    c_col: int
    l_col: int
    o0: int
    pairs: list[tuple[int, int]]


def formulate(p: PlacementProblem, upper: float | None = None,
              symmetric: list[list[int]] | None = None, compact: bool = False) -> Model:
    """The MILP of the module docstring. `upper`: an objective value some placement reaches
    (e.g. the heuristic's): every start and finish of a better schedule is <= upper, so it
    bounds S and C and replaces the big-M, and C + (microbatches - 1) L <= upper cuts off
    worse solutions. `symmetric`: classes of interchangeable devices (same costs, memory and
    transfer times to every device); within a class the load of device k >= that of device
    k + 1, which removes the permutations of identical devices. `compact`: an edge whose
    transfer takes the same time between every pair of distinct devices (a uniform fabric)
    gets D rows S_j >= S_i + P_i + t (x[i, d] - x[j, d]) instead of the D (D - 1) pair rows
    (the same integer solutions: the right side reaches S_i + P_i + t exactly when i is on
    d and j is not)."""
    n, dv = len(p.nodes), len(p.devices)
    pairs = unordered_pairs(p)
    xi = lambda i, d: i * dv + d  # noqa: E731
    s0 = n * dv
    c_col, l_col = s0 + n, s0 + n + 1
    o0 = s0 + n + 2
    ncols = o0 + len(pairs)
    m1 = p.microbatches - 1
    big = sum(max(c) for c in p.cost) + sum(
        max(p.comm(b, d, e) for d in range(dv) for e in range(dv)) for b in p.edges.values())
    if upper is not None:
        big = min(big, upper)
    big = max(big, 1e-9)
    rows = _Rows()

    def proc(i: int, sign: float) -> dict[int, float]:
        return {xi(i, d): sign * p.cost[i][d] for d in range(dv)}

    for i in range(n):
        rows.add({xi(i, d): 1.0 for d in range(dv)}, 1.0, 1.0)
    for d in range(dv):
        rows.add({xi(i, d): p.memory[i] for i in range(n)}, -np.inf, p.capacity[d])
        if m1:
            rows.add({l_col: 1.0} | proc_dev(p, d, xi), 0.0, np.inf)
    for (i, j), b in p.edges.items():
        base = {s0 + j: 1.0, s0 + i: -1.0} | proc(i, -1.0)
        rows.add(base, 0.0, np.inf)
        times = {p.comm(b, d, e) for d in range(dv) for e in range(dv) if d != e}
        if compact and len(times) == 1:
            (t,) = times
            if t > 0:
                for d in range(dv):
                    coefs = dict(base)
                    coefs[xi(i, d)] = coefs.get(xi(i, d), 0.0) - t
                    coefs[xi(j, d)] = coefs.get(xi(j, d), 0.0) + t
                    rows.add(coefs, 0.0, np.inf)
            continue
        for d in range(dv):
            for e in range(dv):
                t = p.comm(b, d, e)
                if d == e or t <= 0:
                    continue
                coefs = dict(base)
                coefs[xi(i, d)] = coefs.get(xi(i, d), 0.0) - t
                coefs[xi(j, e)] = coefs.get(xi(j, e), 0.0) - t
                rows.add(coefs, -t, np.inf)
    for i in range(n):
        rows.add({c_col: 1.0, s0 + i: -1.0} | proc(i, -1.0), 0.0, np.inf)
    for k, (i, j) in enumerate(pairs):
        o = o0 + k
        for d in range(dv):
            # S_j - S_i - P_i - M o - M x_id - M x_jd >= -3M   (i before j when o = 1)
            a = {s0 + j: 1.0, s0 + i: -1.0} | proc(i, -1.0)
            a[o] = -big
            a[xi(i, d)] = a.get(xi(i, d), 0.0) - big
            a[xi(j, d)] = a.get(xi(j, d), 0.0) - big
            rows.add(a, -3 * big, np.inf)
            # S_i - S_j - P_j + M o - M x_id - M x_jd >= -2M   (j before i when o = 0)
            a = {s0 + i: 1.0, s0 + j: -1.0} | proc(j, -1.0)
            a[o] = big
            a[xi(i, d)] = a.get(xi(i, d), 0.0) - big
            a[xi(j, d)] = a.get(xi(j, d), 0.0) - big
            rows.add(a, -2 * big, np.inf)
    if upper is not None:
        rows.add({c_col: 1.0, l_col: float(m1)}, -np.inf, upper)
    for cls in symmetric or []:
        for d, e in zip(cls, cls[1:], strict=False):
            rows.add(proc_dev(p, e, xi) | {xi(i, d): p.cost[i][d] for i in range(n)}, 0.0,
                     np.inf)
    cost = np.zeros(ncols)
    cost[c_col] = 1.0
    cost[l_col] = float(m1)
    integrality = np.zeros(ncols)
    integrality[:s0] = 1
    integrality[o0:] = 1
    lb = np.zeros(ncols)
    ub = np.full(ncols, np.inf)
    ub[:s0] = 1.0
    ub[o0:] = 1.0
    if upper is not None:
        ub[s0:s0 + n + 1] = upper
        ub[l_col] = upper / max(1, m1) if m1 else upper
    a = coo_matrix((rows.v, (rows.r, rows.c)), shape=(len(rows.lb), ncols)).tocsr()
    return Model(cost, a, np.array(rows.lb), np.array(rows.ub), lb, ub, integrality, s0, c_col,
                 l_col, o0, pairs)


def place(p: PlacementProblem, node_limit: int = 2000, time_limit: float = 600.0
          ) -> Placement:
    """Solve the MILP (module docstring) with scipy.optimize.milp, from scratch.
    PlacementError when memory makes it infeasible. `info`: status, nodes explored, dual
    bound, variables, rows, and whether the outer time limit (not the node limit) stopped it."""
    p.check()
    n, dv = len(p.nodes), len(p.devices)
    mo = formulate(p)
    res = milp(mo.c, constraints=[LinearConstraint(mo.a, mo.row_lb, mo.row_ub)],
               integrality=mo.integrality, bounds=Bounds(mo.col_lb, mo.col_ub),
               options={"node_limit": int(node_limit), "time_limit": float(time_limit),
                        "presolve": True, "disp": False})
    s0 = mo.s0
    info = {"status": int(res.status), "message": str(res.message),
            "nodes": int(getattr(res, "mip_node_count", 0) or 0),
            "dual_bound": _f(getattr(res, "mip_dual_bound", None)),
            "variables": len(mo.c), "rows": mo.a.shape[0], "pairs": len(mo.pairs),
            "time_limited": "time limit" in str(res.message).lower()}
    if res.x is None:
        if res.status == 2:
            raise PlacementError("no placement fits the devices' memory (the MILP is "
                                 "infeasible)")
        raise PlacementError(f"the MILP found no placement within {node_limit} nodes "
                             f"({res.message})")
    x = res.x[:s0].reshape(n, dv)
    assign = [int(np.argmax(x[i])) for i in range(n)]
    start = [float(v) for v in res.x[s0:s0 + n]]
    ev = evaluate(p, assign, sorted(range(n), key=lambda i: (start[i], i)), "milp")
    obj = float(res.fun)
    gap = _f(getattr(res, "mip_gap", None))
    if res.status == 0:
        gap = 0.0 if gap is None else gap
    info["milp_objective"] = obj
    # the solver's schedule and the list schedule of its assignment agree up to tolerance;
    # report the list schedule (the yardstick every algorithm here is scored with)
    return Placement(assign, ev.objective, ev.makespan, ev.bottleneck, ev.start, "milp", gap,
                     info)


def proc_dev(p: PlacementProblem, d: int, xi) -> dict[int, float]:
    """-load(d) as coefficients: -sum_i cost[i][d] x[i, d]."""
    return {xi(i, d): -p.cost[i][d] for i in range(len(p.nodes))}


def _f(v) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
