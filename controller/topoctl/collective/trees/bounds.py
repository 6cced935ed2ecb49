"""Independent bounds for AllReduce on a capacitated fabric (rates: data per unit time).

An AllReduce of ``M`` bytes at rate ``R`` takes ``M / R``. Computed without the packing code:

* :func:`partition_bound` -- ``tau = min_P c(delta(P)) / (|P| - 1)`` over partitions ``P`` of the
  nodes (Nash-Williams 1961 / Tutte 1961: the fractional spanning-tree packing number, the
  optimum of tree schedules with reduction at workers on a direct-connect fabric). Exact by
  enumeration for n <= 9 (Bell numbers); otherwise the minimum over the candidate partitions
  singletons, whole vertex set and the components of every capacity threshold: an upper bound
  on tau that is exact whenever the bottleneck partition is among them. O(m * #thresholds).
* :func:`cut_bound` -- ``lambda = min_S min(B_out(S), B_in(S))`` over cuts separating workers:
  no algorithm (even with in-network reduction) beats ``M / lambda``. ``2(N-1)`` max-flows
  (scipy's Dinic) from/to one worker; ``N-1`` on symmetric fabrics.
* :func:`ingress_bound` -- without in-network reduction every byte enters ``2(N-1)`` workers:
  ``R <= sum_w ingress(w) / (2(N-1))``. O(m).
* :func:`rsag_optimum` -- the best reduce-scatter + allgather (ForestColl, arXiv 2402.06787):
  ``T_AG = (M/N) max_S |S cap W| / B_out(S)`` over ``S`` not containing all workers, by
  Dinkelbach iterations, each ``N`` min-cuts; ``T = T_RS + T_AG`` (equal on full-duplex
  fabrics). A *comparator* (another family), not a bound on trees.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components, maximum_flow

from topoctl.fabric.capgraph import CapGraph
from topoctl.limits import SafetyClock

__all__ = [
    "best_bound",
    "cut_bound",
    "ingress_bound",
    "partition_bound",
    "rsag_optimum",
    "tree_bounds",
]

_SCALE = 2**20  # integer capacities for scipy's max-flow


def _partition_value(g: CapGraph, label: np.ndarray) -> float:
    parts = len(set(label.tolist()))
    if parts < 2:
        return math.inf
    cross = label[g.u] != label[g.v]
    return float(g.cap[cross].sum()) / (parts - 1)


def _set_partitions(n: int):
    """All partitions of range(n) as label arrays (restricted growth strings)."""
    a = [0] * n

    def rec(i: int, k: int):
        if i == n:
            yield np.array(a)
            return
        for j in range(k + 1):
            a[i] = j
            yield from rec(i + 1, max(k, j + 1))

    yield from rec(1, 1) if n > 0 else iter(())


def partition_bound(g: CapGraph, exact_up_to: int = 9) -> tuple[float, list[list[int]], bool]:
    """``(tau, bottleneck partition as node-index lists, exact)`` for a direct-connect fabric."""
    if not g.is_direct:
        raise ValueError("the partition bound needs a direct-connect fabric (no switches)")
    n = g.n
    best, best_label = math.inf, None
    if n <= exact_up_to:
        for label in _set_partitions(n):
            val = _partition_value(g, label)
            if val < best:
                best, best_label = val, label.copy()
        exact = True
    else:
        cands = [np.arange(n)]
        for thr in np.unique(g.cap):
            keep = g.cap >= thr
            adj = csr_matrix((np.ones(int(keep.sum())), (g.u[keep], g.v[keep])), shape=(n, n))
            cands.append(connected_components(adj, directed=False)[1])
        for label in cands:
            val = _partition_value(g, label)
            if val < best:
                best, best_label = val, label
        exact = False
    groups: dict[int, list[int]] = {}
    for i, lab in enumerate(best_label.tolist()):
        groups.setdefault(lab, []).append(i)
    return best, list(groups.values()), exact


def ingress_bound(g: CapGraph) -> float:
    """``sum_w ingress(w) / (2(N-1))``: no reduction inside the network."""
    w = list(g.workers)
    return float(g.ingress()[w].sum()) / (2 * (len(w) - 1))


def _flow_net(g: CapGraph, scale: float) -> tuple[np.ndarray, ...]:
    cap = np.maximum(1, np.round(g.cap * scale)).astype(np.int64)
    tail = np.concatenate([g.u, g.v])
    head = np.concatenate([g.v, g.u])
    return tail, head, np.concatenate([cap, cap])


def cut_bound(g: CapGraph, clock: SafetyClock | None = None) -> tuple[float, bool]:
    """``(lambda, complete)``: min worker-separating cut (capacity per direction).

    Full-duplex links make ``B_out(S) = B_in(S)``, so max-flows from ``workers[0]`` to every
    other worker suffice: ``W - 1`` max-flows, deterministic. ``complete`` is False if the
    wall-clock safety ``clock`` cut it short (the value is then still an upper bound on the
    rate, from the flows computed).
    """
    scale = _SCALE / float(g.cap.max())
    tail, head, cap = _flow_net(g, scale)
    mat = csr_matrix((cap.astype(np.int32), (tail, head)), shape=(g.n, g.n))
    mat.sum_duplicates()
    src = g.workers[0]
    # cheap first: the weighted degree of every worker is a cut
    best = float(g.ingress()[list(g.workers)].min()) * scale
    best /= scale
    for t in g.workers[1:]:
        _, side = _min_cut_side(mat, src, t)
        exact_cut = float(g.cap[side[g.u] != side[g.v]].sum())  # unrounded capacities
        best = min(best, exact_cut)
        if clock is not None and clock.expired("cut_bound"):
            return best, False
    return best, True


def _min_cut_side(mat: csr_matrix, s: int, t: int) -> tuple[int, np.ndarray]:
    res = maximum_flow(mat, s, t)
    resid = (mat - res.flow).tocsr()
    seen = np.zeros(mat.shape[0], dtype=bool)
    seen[s] = True
    q = deque([s])
    while q:
        x = q.popleft()
        lo, hi = resid.indptr[x], resid.indptr[x + 1]
        for y, r in zip(resid.indices[lo:hi].tolist(), resid.data[lo:hi].tolist(), strict=True):
            if r > 0 and not seen[y]:
                seen[y] = True
                q.append(y)
    return int(res.flow_value), seen


def rsag_optimum(g: CapGraph, rounds: int = 50, clock: SafetyClock | None = None
                 ) -> tuple[float, bool] | None:
    """``(rate, exact)`` of the optimal reduce-scatter + allgather: ``N / (2 rho*)`` with
    ``rho* = max_S |S cap W| / B_out(S)``, by at most ``rounds`` Dinkelbach rounds of ``W``
    max-flows each (deterministic; ``exact`` when the last round found no better set). The
    wall-clock safety ``clock`` can only cut it short (``exact`` False)."""
    n, w = g.n, list(g.workers)
    nw = len(w)
    deg = g.ingress()
    rho = max(1.0 / float(deg[x]) for x in w)  # S = {w}
    rho = max(rho, (nw - 1) / float(min(deg[x] for x in w)))  # S = V - {w}
    exact = False
    unit = 4096  # integer scale of one worker's weight
    tail0 = np.concatenate([g.u, g.v])
    head0 = np.concatenate([g.v, g.u])
    cap0 = np.concatenate([g.cap, g.cap])
    s_node, z_node = n, n + 1
    big = np.int64(2**30)
    for _ in range(rounds):
        lam = rho  # maximise |S cap W| - rho * B_out(S)  (> 0 iff a better S exists)
        arc = np.maximum(0, np.round(cap0 * lam * unit)).astype(np.int64)
        improved = False
        for t in w:
            tail = np.concatenate([tail0, np.full(nw, s_node), [t]])
            head = np.concatenate([head0, w, [z_node]])
            caps = np.concatenate([arc, np.full(nw, unit), [big]])
            caps = np.minimum(caps, big).astype(np.int32)
            mat = csr_matrix((caps, (tail, head)), shape=(n + 2, n + 2))
            mat.sum_duplicates()
            val, side = _min_cut_side(mat, s_node, z_node)
            gain = nw * unit - val  # = unit*|S cap W| - lam*unit*B_out(S)
            sset = side[:n]
            sw = int(sset[w].sum())
            if gain > 1 and 0 < sw < nw:
                bout = float(g.cap[sset[g.u] != sset[g.v]].sum())  # symmetric links
                if bout > 0 and sw / bout > rho * (1 + 1e-9):
                    rho, improved = sw / bout, True
            if clock is not None and clock.expired("rsag_optimum"):
                return nw / (2 * rho), False
        if not improved:
            exact = True
            break
    return nw / (2 * rho), exact


def tree_bounds(
    g: CapGraph, lp_upper: float | None = None, clock: SafetyClock | None = None
) -> dict[str, float | None]:
    """Upper bounds on the rate of tree schedules, plus the RS+AG comparator.

    Keys: ``partition`` (direct only), ``cut``, ``ingress``, ``lp_certificate`` (the packing
    LP's dual certificate, if given) and ``rsag`` (comparator, <= 64 workers). Deterministic;
    ``clock`` is the wall-clock safety net (the steps it cut short are recorded in it).
    """
    out: dict[str, float | None] = {}
    if g.is_direct:
        out["partition"] = partition_bound(g)[0]
    out["cut"] = cut_bound(g, clock=clock)[0]
    out["ingress"] = ingress_bound(g)
    if lp_upper is not None:
        out["lp_certificate"] = lp_upper
    r = rsag_optimum(g, clock=clock) if len(g.workers) <= 64 else None
    out["rsag"] = r[0] if r else None
    return out


def best_bound(bounds: dict[str, float | None]) -> tuple[str, float]:
    """The tightest upper bound on tree schedules (the RS+AG comparator excluded)."""
    names = ["partition", "lp_certificate", "cut", "ingress"]
    vals = [(bounds[k], i, k) for i, k in enumerate(names) if bounds.get(k) is not None]
    v, _, k = min(vals)
    return k, float(v)
