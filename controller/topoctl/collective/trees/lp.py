"""Fractional spanning-tree packing: multiplicative weights, then exact column generation.

Problem (INFOCOM'21 "Near-optimal topology-adaptive parameter synchronization", Zhang, Wu, Li;
Blink, MLSys'20): maximise ``sum_T x_T`` subject to ``sum_T count_r(T) x_T <= c_r`` for every
resource row ``r`` (link, or arc with switches), ``x >= 0``. On a direct-connect fabric the
optimum is the partition bound ``tau`` (Nash-Williams/Tutte).

* :func:`mw_pack` -- Garg-Koenemann multiplicative weights (FOCS'98) with an MST oracle:
  each iteration routes the bottleneck capacity of the current shortest tree and multiplies
  its rows' lengths by ``1 + eps * load``; O(iterations * oracle). Its lengths also give an
  upper bound (weak duality): ``OPT <= c.l / min_T l(T)``.
* :func:`column_generation` -- restricted master LP over the generated trees solved with HiGHS
  (scipy ``linprog``), priced by the oracle under the LP duals, until no tree has negative
  reduced cost (exact optimum) or the dual certificate closes the gap.
* :func:`solve_restricted` -- the master LP over a fixed set of columns.
* :func:`usage_matrix` -- the LP's constraint matrix (rows used by each column).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csc_matrix

from topoctl.limits import SafetyClock

from .oracle import Column, Oracle

__all__ = ["ColumnPool", "column_generation", "mw_pack", "solve_restricted", "usage_matrix"]


@dataclass
class ColumnPool:
    """Distinct columns found so far."""

    columns: list[Column]

    def __init__(self) -> None:
        self.columns = []
        self._keys: set[bytes] = set()

    def add(self, col: Column) -> bool:
        """Add a column unless an identical one is present; whether it was added."""
        if col.key in self._keys:
            return False
        self._keys.add(col.key)
        self.columns.append(col)
        return True


def usage_matrix(cols: list[Column], rows: int) -> csc_matrix:
    """The constraint matrix ``A`` of the packing LP: ``A[r, j]`` is how many times column
    (tree) ``cols[j]`` uses resource row ``r``; ``rows`` rows in all, one column per tree."""
    data = np.concatenate([c.counts for c in cols])
    ridx = np.concatenate([c.rows for c in cols])
    ptr = np.cumsum([0] + [len(c.rows) for c in cols])
    return csc_matrix((data, ridx, ptr), shape=(rows, len(cols)))


def solve_restricted(
    cols: list[Column], capacity: np.ndarray
) -> tuple[np.ndarray, float, np.ndarray]:
    """Solve ``max 1.x : A x <= c, x >= 0`` over ``cols`` with HiGHS.

    Returns ``(x, value, y)`` with ``y`` the (non-negative) row duals over all rows.
    Rows no column uses are dropped from the LP (their dual is 0).
    """
    a = usage_matrix(cols, capacity.shape[0]).tocsr()
    used = np.flatnonzero(np.diff(a.indptr))
    res = linprog(
        -np.ones(len(cols)),
        A_ub=a[used],
        b_ub=capacity[used],
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed: {res.message}")
    y = np.zeros(capacity.shape[0])
    y[used] = np.maximum(-res.ineqlin.marginals, 0.0)
    return np.maximum(res.x, 0.0), float(-res.fun), y


def mw_pack(
    oracle: Oracle,
    eps: float = 0.1,
    max_iters: int = 5000,
    clock: SafetyClock | None = None,
) -> tuple[list[Column], np.ndarray, float, int]:
    """Garg-Koenemann packing.

    Returns ``(columns, flows, upper_bound, iterations)``: the distinct trees used with their
    feasible rates (scaled by the maximum row load, so the packing fits), and the best
    weak-duality bound. Stops at the Garg-Koenemann criterion ``c.l >= 1`` or ``max_iters``
    (deterministic), or when the wall-clock safety ``clock`` expires (recorded in it).
    """
    pool = ColumnPool()
    flow: dict[bytes, float] = {}
    cap = oracle.capacity
    rows = cap.shape[0]
    delta = (1 + eps) * ((1 + eps) * rows) ** (-1.0 / eps)
    length = delta / cap
    load = np.zeros(rows)
    total = 0.0
    ub = math.inf
    it = 0
    while it < max_iters:
        dval = float(cap @ length)
        if dval >= 1.0:
            break
        col = oracle(length)
        if col.weight > 0:
            ub = min(ub, dval / col.weight)
        pool.add(col)
        f = float(np.min(cap[col.rows] / col.counts))
        flow[col.key] = flow.get(col.key, 0.0) + f
        load[col.rows] += f * col.counts
        length[col.rows] *= 1.0 + eps * f * col.counts / cap[col.rows]
        total += f
        it += 1
        if clock is not None and clock.expired("mw_pack"):
            break
    scale = float(np.max(load / cap)) if total > 0 else 1.0
    flows = np.array([flow[c.key] / scale for c in pool.columns])
    return pool.columns, flows, ub, it


def column_generation(
    oracle: Oracle,
    pool: ColumnPool,
    gap: float = 1e-7,
    max_iters: int = 2000,
    clock: SafetyClock | None = None,
    per_round: int = 4,
) -> tuple[np.ndarray, float, float, int]:
    """Solve the packing LP to optimality by column generation over ``pool``.

    Returns ``(x, value, upper_bound, iterations)``; ``x`` is aligned with ``pool.columns``.
    The upper bound is the dual certificate ``c.y / min_T y(T)`` (valid for any ``y >= 0``);
    at exit ``value >= (1 - gap) * upper_bound`` unless ``max_iters`` LP solves were reached
    (deterministic) or the wall-clock safety ``clock`` expired (recorded in it).
    """
    cap = oracle.capacity
    if not pool.columns:
        pool.add(oracle(np.ones_like(cap)))
    ub = math.inf
    it = 0
    while True:
        x, val, y = solve_restricted(pool.columns, cap)
        col = oracle(y)
        if col.weight > 1e-15:
            ub = min(ub, float(cap @ y) / col.weight)
        it += 1
        if col.weight >= 1.0 - 1e-9 or val >= (1.0 - gap) * ub:
            break
        added = pool.add(col)
        # a few more columns per LP solve: price again with the found tree's rows penalised
        yp = y.copy()
        bump = float(y[y > 0].mean()) if np.any(y > 0) else 1.0
        extra = col
        for _ in range(per_round - 1):
            yp[extra.rows] += bump * extra.counts
            extra = oracle(yp)
            if float((y[extra.rows] * extra.counts).sum()) < 1.0 - 1e-9:
                added = pool.add(extra) or added
        if not added or it >= max_iters:
            break
        if clock is not None and clock.expired("column_generation"):
            break
    return x, val, max(ub, val), it
