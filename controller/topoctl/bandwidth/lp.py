"""Per-destination rates and multipath splits from a traffic matrix: a path-based LP.

Input: `demand[(s, d)]` bytes host s sends host d in one iteration, `paths[(s, d)]` candidate
paths (tuples of directed link ids; the first link leaves s), `capacity[link]` bytes/s.
Output: a rate (bytes/s) on every candidate path.

Objectives (both documented in docs/bandwidth.md):

* ``minmax`` -- minimise the completion time of the slowest transfer of the iteration, all of
  them sent concurrently. With ``y = 1/T`` this is the maximum concurrent flow problem
  (Shahrokhi & Matula, JACM'90) restricted to the candidate paths:
  maximise y s.t. ``sum_p x_p >= demand_sd * y`` for every pair, ``sum_{p ∋ l} x_p <= c_l`` for
  every link, ``x >= 0``. Optimal for the candidate paths (HiGHS); a second LP with y fixed at
  its optimum minimises the link usage ``sum_p len(p) x_p``, so no pair gets more than it needs
  and detours are used only where the direct path is not enough (the thesis' policy-routing
  case). Every pair then finishes at the same time T* = 1/y*.
* ``proportional`` -- no coordination between hosts: each pair keeps its first (shortest) path
  and every link's capacity is divided among the pairs crossing it in proportion to their
  demand; a pair's rate is its smallest share along its path. Feasible, never better than
  ``minmax`` (it is one point of the same LP's feasible set), O(pairs * path length).

Size: one variable per candidate path plus one; rows = links + pairs. HiGHS solves a
1,000-path instance in milliseconds. Deterministic (no randomness, ordered inputs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

Pair = tuple[str, str]
LinkPath = tuple[str, ...]

OBJECTIVES = ("minmax", "proportional")


class BandwidthError(ValueError):
    """The problem cannot be solved (a pair without a path, a non-positive capacity)."""


@dataclass
class Allocation:
    """`rates[(s, d)]` = [(path, bytes/s)] with positive rates only; `time` = the iteration's
    communication completion time if every pair sends its demand at these rates concurrently
    (max over pairs of demand / total rate)."""

    objective: str
    rates: dict[Pair, list[tuple[LinkPath, float]]] = field(default_factory=dict)
    time: float = 0.0

    def total(self, pair: Pair) -> float:
        """The pair's total rate over all its paths (bytes/s; 0 for an unknown pair)."""
        return sum(r for _, r in self.rates.get(pair, []))

    def link_load(self) -> dict[str, float]:
        """Link id -> the sum of the rates of the paths through it (bytes/s)."""
        out: dict[str, float] = {}
        for lst in self.rates.values():
            for path, r in lst:
                for ln in path:
                    out[ln] = out.get(ln, 0.0) + r
        return out


def allocate(demand: Mapping[Pair, float], paths: Mapping[Pair, Sequence[LinkPath]],
             capacity: Mapping[str, float], objective: str = "minmax") -> Allocation:
    """Rates per candidate path for every pair with positive demand (see module docstring)."""
    if objective not in OBJECTIVES:
        raise BandwidthError(f"unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})")
    pairs = sorted(p for p, b in demand.items() if b > 0)
    for p in pairs:
        if not paths.get(p):
            raise BandwidthError(f"no candidate path from {p[0]} to {p[1]}")
        for path in paths[p]:
            for ln in path:
                if not capacity.get(ln, 0) > 0:
                    raise BandwidthError(f"link {ln} on a path {p[0]}->{p[1]} has no capacity")
    if not pairs:
        return Allocation(objective)
    if objective == "proportional":
        return _proportional(demand, pairs, paths, capacity)
    return _minmax(demand, pairs, paths, capacity)


def _proportional(demand, pairs, paths, capacity) -> Allocation:
    on_link: dict[str, float] = {}
    for p in pairs:
        for ln in paths[p][0]:
            on_link[ln] = on_link.get(ln, 0.0) + demand[p]
    alloc = Allocation("proportional")
    for p in pairs:
        path = tuple(paths[p][0])
        r = min(capacity[ln] * demand[p] / on_link[ln] for ln in path)
        alloc.rates[p] = [(path, r)]
        alloc.time = max(alloc.time, demand[p] / r)
    return alloc


def _minmax(demand, pairs, paths, capacity) -> Allocation:
    cols: list[tuple[Pair, LinkPath]] = []
    for p in pairs:
        seen = set()
        for path in paths[p]:
            if tuple(path) not in seen:  # duplicates would only split one path's rate
                seen.add(tuple(path))
                cols.append((p, tuple(path)))
    links = sorted({ln for _, path in cols for ln in path})
    lrow = {ln: i for i, ln in enumerate(links)}
    prow = {p: len(links) + i for i, p in enumerate(pairs)}
    n = len(cols)  # x_0..x_{n-1}, y = x_n
    rows, colidx, vals = [], [], []
    for j, (p, path) in enumerate(cols):
        for ln in path:
            rows.append(lrow[ln])
            colidx.append(j)
            vals.append(1.0)
        rows.append(prow[p])  # demand * y - sum x_p <= 0
        colidx.append(j)
        vals.append(-1.0)
    # scale: demands in units of the largest one, capacities in units of the largest capacity,
    # so HiGHS sees numbers near 1 (bytes and bytes/s span 10 orders of magnitude)
    dmax = max(demand[p] for p in pairs)
    cmax = max(capacity[ln] for ln in links)
    for p in pairs:
        rows.append(prow[p])
        colidx.append(n)
        vals.append(demand[p] / dmax)
    a = coo_matrix((vals, (rows, colidx)), shape=(len(links) + len(pairs), n + 1)).tocsr()
    b = np.array([capacity[ln] / cmax for ln in links] + [0.0] * len(pairs))
    c = np.zeros(n + 1)
    c[n] = -1.0
    r1 = linprog(c, A_ub=a, b_ub=b, bounds=(0, None), method="highs")
    if r1.status != 0:
        raise BandwidthError(f"bandwidth LP failed: {r1.message}")
    y = float(r1.x[n])
    # stage 2: y at its optimum (minus a relative 1e-9 for round-off), least link usage
    c2 = np.array([float(len(path)) for _, path in cols] + [0.0])
    bounds = [(0, None)] * n + [(y * (1 - 1e-9), None)]
    r2 = linprog(c2, A_ub=a, b_ub=b, bounds=bounds, method="highs")
    x = r2.x if r2.status == 0 else r1.x
    alloc = Allocation("minmax")
    for (p, path), v in zip(cols, x[:n], strict=True):
        if v * cmax > 1e-9 * cmax:
            alloc.rates.setdefault(p, []).append((path, float(v * cmax)))
    t = 0.0
    for p in pairs:
        tot = alloc.total(p)
        t = max(t, demand[p] / tot if tot > 0 else math.inf)
    alloc.time = t
    return alloc
