"""Topology-adaptive AllReduce by packed spanning trees (the ``trees`` strategy's algorithm).

Zhang, Wu, Li, "Near-optimal topology-adaptive parameter synchronization in distributed DNN
training", IEEE INFOCOM 2021 (doi:10.1109/INFOCOM42981.2021.9488678); Blink (MLSys'20). The
gradient of ``M`` bytes is split into partitions proportional to tree rates ``x_T``; each
partition is reduced toward its tree's root and broadcast back down the same tree, pipelined,
all trees at once. Time per byte is ``1 / sum_T x_T`` (plus pipeline fill), so the best
schedule is a maximum fractional
spanning-tree packing; on a direct-connect fabric its value is the partition bound ``tau``.

Pipeline of :func:`plan_trees`:

1. Garg-Koenemann multiplicative weights with an MST oracle (warm start, O(I * m log n));
2. restricted LP + column generation with HiGHS to the exact LP optimum (dual certificate);
3. pruning to at most ``max_trees`` trees: top-K re-solve, K-bounded column swaps, then a small
   MILP (HiGHS) choosing the best K of the candidate trees, and a final LP re-solve; on
   direct-connect fabrics with uniform capacity the candidates include an exact edge-disjoint
   spanning-tree packing (matroid union, :mod:`.disjoint_trees`);
4. roots spread over distinct workers, each at a centre of its tree (minimum height).

Pure functions over plain data; no I/O.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import LinearConstraint, milp
from scipy.sparse import csr_matrix, diags, hstack, identity
from scipy.sparse.csgraph import minimum_spanning_tree, shortest_path

from topoctl.fabric.capgraph import CapGraph
from topoctl.limits import SafetyClock

from .bounds import ingress_bound, partition_bound
from .disjoint import disjoint_spanning_trees
from .lp import ColumnPool, column_generation, mw_pack, solve_restricted, usage_matrix
from .oracle import Column, Oracle

__all__ = [
    "PackedTree",
    "TreePlan",
    "auto_max_trees",
    "chunk_bytes",
    "disjoint_candidates",
    "pipelined_time",
    "plan_trees",
]


@dataclass
class PackedTree:
    """One tree of the schedule, by rank (rank r = ``workers[r]``).

    ``parents[r]`` is r's parent rank (``None`` at the root); ``paths`` maps a tree edge
    ``(a, b)`` (ranks, ``a < b``) that is not a direct link to its routed node paths
    ``(a->b, b->a)``.
    """

    root: int
    parents: list[int | None]
    rate: float
    height: int
    paths: dict[tuple[int, int], tuple[list[int], list[int]]] = field(default_factory=dict)

    @property
    def edges(self) -> list[tuple[int, int]]:
        """The tree's (parent, child) pairs."""
        return [(p, r) for r, p in enumerate(self.parents) if p is not None]


@dataclass
class TreePlan:
    """Result of :func:`plan_trees`. Rates are in the fabric's capacity unit (data / time)."""

    trees: list[PackedTree]
    rate: float  # sum of the kept trees' rates: time per unit of data = 1 / rate
    lp_optimum: float  # column generation value over all trees (before pruning)
    upper_bound: float  # dual certificate on the LP optimum
    mw_rate: float  # Garg-Koenemann's feasible packing alone
    columns: int
    lp_iterations: int
    seconds: float  # wall clock spent (reported, never used to decide anything)
    mode: str  # "direct" or "switched"
    timings: dict[str, float] = field(default_factory=dict)
    cut_short: list[str] = field(default_factory=list)  # steps the safety clock stopped

    @property
    def fractions(self) -> list[float]:
        """Each tree's share of the data (its rate over the total rate)."""
        return [t.rate / self.rate for t in self.trees]


def auto_max_trees(g: CapGraph, lo: int = 16, hi: int = 256) -> int:
    """How many trees the optimum needs at least, clamped to ``[lo, hi]``.

    A tree's rate is at most its weakest link and every tree crosses every cut, so a tree's
    rate is at most ``c_b = min_S max_{e in delta(S)} c_e`` (the weakest edge of a maximum
    spanning tree): at least ``tau / c_b`` trees are needed (two racks joined by slow cables:
    tau / slow; uniform K_n: n/2). Direct fabrics only (switched: ``lo``).
    """
    if not g.is_direct:
        return lo
    tau = partition_bound(g, exact_up_to=0)[0]
    top = float(g.cap.max())
    inv = csr_matrix((top + 1.0 - g.cap, (g.u, g.v)), shape=(g.n, g.n))
    mst = minimum_spanning_tree(inv)  # maximum spanning tree of the capacities
    c_b = top + 1.0 - float(mst.data.max())
    need = math.ceil(tau / c_b - 1e-9)
    return int(min(hi, max(lo, need)))


def plan_trees(
    g: CapGraph,
    max_trees: int | None = None,
    mw_eps: float = 0.1,
    mw_iters: int = 5000,
    lp_iters: int = 2000,
    swaps: int = 64,
    milp_nodes: int = 2000,
    clock: SafetyClock | None = None,
    greedy_factor: float = 1.25,
    shortcut_gap: float = 0.02,
) -> TreePlan:
    """Pack spanning trees over ``g.workers`` and keep at most ``max_trees`` of them
    (default: :func:`auto_max_trees`).

    Deterministic: the searches are bounded by counts (``mw_iters`` Garg-Koenemann steps,
    ``lp_iters`` column-generation rounds, ``swaps`` pruning swaps, ``milp_nodes`` branch and
    bound nodes), so the same graph gives the same trees on any machine. ``clock`` (default
    :class:`~topoctl.limits.SafetyClock`) is only a wall-clock safety net; the steps it cut
    short are listed in ``TreePlan.cut_short``.

    Shortcut (``max_trees >= 16``; switched fabrics: the Hamiltonian chains of
    :func:`chain_candidates` within 0.5% of the ingress bound: leaf-spine 1,024 99.9% in 3 s
    where column generation runs into the safety limit): the edge-disjoint trees, else
    ``ceil(greedy_factor * max_trees)`` (<= 256) load-balanced MSTs
    (:func:`greedy_disjoint`: each an MST under the relative load of the previous ones) and
    their restricted LP; if at most ``max_trees`` of them carry flow and the packing is within
    ``shortcut_gap`` of the partition bound ``tau`` (an upper bound on any tree packing), it is
    the plan: no MW, column generation or pruning (two-rack mesh 64: 171 trees, 98.4% of tau,
    0.2 s, where column generation over 174+ trees takes minutes). Deterministic (values, not
    time).

    Complexity: MW ``O(I * oracle)``, column generation ``O(L * (LP + oracle))`` where the
    oracle is an MST (direct) or ``W`` Dijkstras + a dense MST (switched); shortcut
    ``O(K m log n)`` + one LP.
    """
    if max_trees is None:
        max_trees = auto_max_trees(g)
    if max_trees < 1:
        raise ValueError("max_trees must be >= 1")
    clock = clock or SafetyClock()
    t0 = time.perf_counter()
    oracle = Oracle(g)
    scale = float(oracle.capacity.max())
    oracle.capacity = oracle.capacity / scale
    disjoint = disjoint_candidates(oracle, max_trees, clock)
    td = time.perf_counter()
    quick = _greedy_shortcut(g, oracle, max_trees, greedy_factor, shortcut_gap, disjoint)
    if quick is not None:  # load-balanced MSTs already within shortcut_gap of tau
        cols, rates, val = quick
        trees = _rooted(g, cols, rates * scale)
        return TreePlan(
            trees=trees, rate=float(sum(t.rate for t in trees)), lp_optimum=val * scale,
            upper_bound=float(partition_bound(g, exact_up_to=0)[0] if g.is_direct
                              else ingress_bound(g)), mw_rate=0.0,
            columns=len(cols), lp_iterations=0, seconds=time.perf_counter() - t0,
            mode="direct" if g.is_direct else "switched",
            timings={"disjoint": td - t0, "greedy": time.perf_counter() - td},
            cut_short=list(clock.cut))
    mw_cols, flows, mw_ub, _ = mw_pack(oracle, eps=mw_eps, max_iters=mw_iters, clock=clock)
    mw_rate = float(flows.sum())
    t1 = time.perf_counter()
    # seed the master LP with the trees that carried most flow (dense columns make HiGHS slow);
    # a stable sort: equal flows keep their discovery order on every machine
    ranked = [mw_cols[i] for i in np.argsort(-flows, kind="stable")]
    pool = ColumnPool()
    for col in ranked[: max(32, min(4 * max_trees, 256))]:  # LP solves grow with columns
        pool.add(col)
    x, lp_val, ub, iters = column_generation(oracle, pool, max_iters=lp_iters, clock=clock)
    if lp_val < mw_rate:  # not converged within its iterations: the MW packing is better
        lp_val = mw_rate
    ub = max(min(ub, mw_ub), lp_val)
    t2 = time.perf_counter()
    for col in ranked:
        pool.add(col)
    x = np.concatenate([x, np.zeros(len(pool.columns) - len(x))])
    cols, rates = prune(oracle, pool, x, max_trees, swaps=swaps, milp_nodes=milp_nodes,
                        extra=disjoint, clock=clock)
    t3 = time.perf_counter()
    trees = _rooted(g, cols, rates * scale)
    kept = float(rates.sum())
    lp_val = max(lp_val, kept)  # column generation stopped at its limit below a kept packing
    ub = max(ub, lp_val)
    return TreePlan(
        trees=trees,
        rate=float(sum(t.rate for t in trees)),
        lp_optimum=lp_val * scale,
        upper_bound=ub * scale,
        mw_rate=mw_rate * scale,
        columns=len(pool.columns),
        lp_iterations=iters,
        seconds=time.perf_counter() - t0,
        mode="direct" if g.is_direct else "switched",
        timings={"disjoint": td - t0, "mw": t1 - td, "lp": t2 - t1, "prune": t3 - t2},
        cut_short=list(clock.cut),
    )


def _greedy_shortcut(g: CapGraph, oracle: Oracle, max_trees: int, factor: float, gap: float,
                     disjoint: list[Column] | None = None
                     ) -> tuple[list[Column], np.ndarray, float] | None:
    """The shortcut of :func:`plan_trees`: the edge-disjoint trees, else the greedy packing, if
    within ``gap`` of tau with at most ``max_trees`` trees; None when it does not apply."""
    if factor <= 0 or gap <= 0 or max_trees < 16:
        return None
    scale = float(np.max(oracle.g.cap)) if oracle.g.cap.size else 1.0
    if not g.is_direct:  # switched: the ring-like chains against the ingress bound, within
        gap = min(gap, 0.005)  # 0.5% (the full search reaches 99.9-100% on small fabrics)
        bound = ingress_bound(g) / scale
        cols = chain_candidates(oracle, max_trees)
        if cols:
            x, val, _ = solve_restricted(cols, oracle.capacity)
            keep, rates = _positive(cols, x)
            if len(keep) <= max_trees and val >= (1.0 - gap) * bound:
                return keep, rates, val
        return None
    tau = partition_bound(g, exact_up_to=0)[0] / scale
    k = int(min(256, math.ceil(factor * max_trees)))
    for make in (lambda: list(disjoint or []), lambda: greedy_disjoint(oracle, k)):
        cols = make()
        if not cols:
            continue
        x, val, _ = solve_restricted(cols, oracle.capacity)
        keep, rates = _positive(cols, x)
        if len(keep) <= max_trees and val >= (1.0 - gap) * tau:
            return keep, rates, val
    return None


def prune(
    oracle: Oracle,
    pool: ColumnPool,
    x: np.ndarray,
    k: int,
    swaps: int = 64,
    milp_nodes: int = 2000,
    extra: list[Column] | None = None,
    clock: SafetyClock | None = None,
) -> tuple[list[Column], np.ndarray]:
    """Best packing with at most ``k`` trees found within ``swaps`` column swaps and a MILP of
    at most ``milp_nodes`` branch-and-bound nodes (deterministic; ``clock`` is the wall-clock
    safety net only).

    ``extra``: further candidate trees, also tried as a start (e.g. :func:`disjoint_candidates`).
    Top-k of the LP solution re-solved; then K-bounded column swaps (price a tree under the
    duals of the k-tree LP, add it, drop the smallest, keep if better); then a MILP over the
    candidate trees with ``sum z_T <= k`` and ``x_T <= U_T z_T``.
    """
    cap = oracle.capacity
    order = [int(i) for i in np.argsort(-x, kind="stable") if x[i] > 1e-12]
    lp_top = [pool.columns[i] for i in order] or [pool.columns[0]]
    chains = chain_candidates(oracle, k)
    greedy = greedy_disjoint(oracle, k)
    extra = list(extra or [])[:k]
    seen: set[bytes] = set()
    cand: list[Column] = []
    for col in [*extra, *lp_top[: 2 * k], *chains, *greedy, *lp_top[2 * k :]]:
        if col.key not in seen:
            seen.add(col.key)
            cand.append(col)
    if len(cand) <= k:
        xs, _, _ = solve_restricted(cand, cap)
        return _positive(cand, xs)
    best, bx, bval, by = [], np.zeros(0), -1.0, np.zeros_like(cap)
    for start in (lp_top[:k], chains[:k], greedy[:k], extra):
        if start:
            sx, sval, sy = solve_restricted(start, cap)
            if sval > bval:
                best, bx, bval, by = start, sx, sval, sy
    for _ in range(swaps):
        if clock is not None and clock.expired("prune swaps"):
            break
        col = oracle(by)
        if col.weight >= 1 - 1e-9:
            break
        trial = [*best, col]
        tx, _, _ = solve_restricted(trial, cap)
        drop = int(np.argmin(tx))
        trial.pop(drop)
        tx2, tval, ty = solve_restricted(trial, cap)
        if col.key not in seen:
            seen.add(col.key)
            cand.append(col)
        if tval <= bval * (1 + 1e-9):
            break
        best, bx, bval, by = trial, tx2, tval, ty
    if milp_nodes > 0 and not (clock is not None and clock.expired("prune milp")):
        left = clock.left() if clock is not None else None
        pick = _milp_pick(cand[: max(4 * k, 48)], cap, k, milp_nodes, left)
        if pick is not None:
            px, pval, _ = solve_restricted(pick, cap)
            if pval > bval * (1 + 1e-9):
                best, bx, bval = pick, px, pval
    return _positive(best, bx)


def chain_candidates(oracle: Oracle, k: int) -> list[Column]:
    """Low-degree trees that pruning to few trees needs (an MST under duals is often a star).

    Switched fabrics: ``k`` rotations of one Hamiltonian chain of the workers in DFS order of
    the fabric (neighbours stay close), each routed on fewest hops: every worker's uplink
    carries at most 2 edges per chain, as in a ring. Complete direct-connect fabrics:
    Walecki's zig-zag Hamiltonian paths (n/2 of them decompose K_n for even n).
    """
    g = oracle.g
    nw = len(g.workers)
    if nw < 3:
        return []
    chains: list[list[int]] = []
    if not g.is_direct:
        adj: dict[int, list[int]] = {}
        for a, b in zip(g.u.tolist(), g.v.tolist(), strict=True):
            adj.setdefault(a, []).append(b)
            adj.setdefault(b, []).append(a)
        pos = {node: r for r, node in enumerate(g.workers)}
        order, seen, stack = [], set(), [g.workers[0]]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x in pos:
                order.append(pos[x])
            stack.extend(sorted(adj.get(x, []), reverse=True))
        for s in range(min(k, nw)):
            start = s * nw // min(k, nw)
            chains.append(order[start:] + order[:start])
    elif g.m == nw * (nw - 1) // 2:
        for i in range(min(k, (nw + 1) // 2)):
            path = [i]
            for j in range(1, nw):
                step = (j + 1) // 2 if j % 2 else -(j // 2)
                path.append((i + step) % nw)
            chains.append(path)
    out = []
    load = np.zeros(oracle.rows)
    for chain in chains:
        pairs = list(zip(chain[:-1], chain[1:], strict=True))
        try:
            if g.is_direct:
                col = oracle.column_for(pairs)
            else:  # fewest hops, ties broken away from arcs earlier chains loaded (spines)
                col = oracle.column_for(pairs, 1.0 + 1e-3 * load / oracle.capacity)
        except ValueError:
            continue
        load[col.rows] += col.counts
        out.append(col)
    return out


def disjoint_candidates(oracle: Oracle, k: int, clock: SafetyClock | None = None
                        ) -> list[Column]:
    """Up to ``k`` edge-disjoint spanning trees of a direct-connect fabric of uniform capacity.

    With every link at capacity ``c``, ``j`` edge-disjoint spanning trees carry ``j c``; the
    integral packing number is at most ``min(floor(m / (n - 1)), min degree)`` (the
    Nash-Williams/Tutte partition bound on the whole vertex set and on singletons). On regular
    graphs (hypercubes, tori, circulants) ``tau = m c / (n - 1)`` and the integral packing
    reaches ``floor(tau / c) c`` (Q10: 5 of 5.005), a packing that MST-priced column
    generation and pruning do not find (Q10: 4 trees plus fractions). Matroid-union augmenting
    paths (:func:`disjoint_spanning_trees`; Q10: 0.25 s) find a maximum union of ``j`` forests;
    if it is not ``j`` spanning trees, ``j - 1`` is tried. Other fabrics: ``[]``.
    """
    g = oracle.g
    cap = oracle.capacity
    if not g.is_direct or g.n < 2 or float(cap.max()) > float(cap.min()) * (1 + 1e-9):
        return []
    deg = np.bincount(np.concatenate([g.u, g.v]), minlength=g.n)
    want = int(min(k, g.m // (g.n - 1), int(deg.min())))
    edges = list(zip(g.u.tolist(), g.v.tolist(), strict=True))
    rank = {node: r for r, node in enumerate(g.workers)}
    for j in (want, want - 1):
        if j < 1 or (clock is not None and clock.expired("disjoint_candidates")):
            break
        forests = disjoint_spanning_trees(g.n, edges, j, clock=clock)
        spanning = [f for f in forests if len(f) == g.n - 1]
        if len(spanning) == j or j < want:
            return [oracle.column_for([(rank[edges[e][0]], rank[edges[e][1]]) for e in f])
                    for f in spanning]
    return []


def greedy_disjoint(oracle: Oracle, k: int) -> list[Column]:
    """``k`` trees, each an MST under the relative load the previous ones put on the rows
    (ties broken at random, seeded): edge-disjoint whenever the greedy order allows it."""
    rng = np.random.default_rng(0)
    cap = oracle.capacity
    load = np.zeros_like(cap)
    out = []
    for _ in range(k):
        col = oracle(1e-3 * (1 + rng.random(cap.shape[0])) + load / cap)
        load[col.rows] += col.counts
        out.append(col)
    return out


def _positive(cols: list[Column], x: np.ndarray) -> tuple[list[Column], np.ndarray]:
    keep = [i for i in range(len(cols)) if x[i] > 1e-12]
    return [cols[i] for i in keep], np.array([x[i] for i in keep])


def _milp_pick(cols: list[Column], cap: np.ndarray, k: int, nodes: int,
               safety_s: float | None) -> list[Column] | None:
    """At most ``k`` of ``cols`` maximising the packed rate: a MILP limited to ``nodes``
    branch-and-bound nodes (deterministic; HiGHS runs single-threaded here), with the safety
    clock's remaining seconds as HiGHS's time limit."""
    n = len(cols)
    a = usage_matrix(cols, cap.shape[0]).tocsr()
    used = np.flatnonzero(np.diff(a.indptr))
    a = a[used]
    ubound = np.array([float(np.min(cap[c.rows] / c.counts)) for c in cols])
    eye = identity(n, format="csr")
    cons = [
        LinearConstraint(hstack([a, csr_matrix((len(used), n))]), -np.inf, cap[used]),
        LinearConstraint(hstack([eye, -diags(ubound)]), -np.inf, 0.0),
        LinearConstraint(hstack([csr_matrix((1, n)), np.ones((1, n))]), -np.inf, k),
    ]
    res = milp(
        np.concatenate([-np.ones(n), np.zeros(n)]),
        constraints=cons,
        integrality=np.concatenate([np.zeros(n), np.ones(n)]),
        bounds=(np.zeros(2 * n), np.concatenate([ubound, np.ones(n)])),
        options={"node_limit": nodes, "disp": False,
                 **({"time_limit": max(safety_s, 0.1)} if safety_s is not None else {})},
    )
    if res.x is None:
        return None
    z = res.x[n:]
    return [cols[i] for i in range(n) if z[i] > 0.5] or None


def _rooted(g: CapGraph, cols: list[Column], rates: np.ndarray) -> list[PackedTree]:
    """Give each tree a distinct root at (near) its centre; parents by rank."""
    rank = {node: r for r, node in enumerate(g.workers)}
    nw = len(g.workers)
    order = np.argsort(-rates)
    taken: set[int] = set()
    out: list[PackedTree] = []
    for i in order.tolist():
        col = cols[i]
        a = np.array([rank[e[0]] for e in col.edges])
        b = np.array([rank[e[1]] for e in col.edges])
        adj = csr_matrix((np.ones(len(a)), (a, b)), shape=(nw, nw))
        hops = shortest_path(adj, directed=False, unweighted=True)
        ecc = hops.max(axis=1)
        free = [r for r in np.argsort(ecc, kind="stable").tolist() if r not in taken]
        root = free[0] if free else int(np.argmin(ecc))
        taken.add(root)
        parents: list[int | None] = [None] * nw
        dist = hops[root]
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            if dist[x] < dist[y]:
                parents[y] = x
            else:
                parents[x] = y
        paths = {}
        for (u, v), (puv, pvu) in col.paths.items():  # keys (a, b) with rank a < rank b
            if rank[u] < rank[v]:
                paths[(rank[u], rank[v])] = (puv, pvu)
            else:
                paths[(rank[v], rank[u])] = (pvu, puv)
        out.append(PackedTree(root, parents, float(rates[i]), int(ecc[root]), paths))
    return out


def pipelined_time(
    nbytes: float, rate: float, height: int, chunk: float, latency: float
) -> float:
    """Time of one tree's pipelined reduce+broadcast of ``nbytes`` at ``rate`` bytes/s.

    ``(ceil(m/s) + 2h - 1) * (a + s/r)`` (notes: NCCL-style pipelined tree model), with
    ``a`` the per-hop latency.
    """
    if nbytes <= 0:
        return 0.0
    s = min(chunk, nbytes)
    steps = math.ceil(nbytes / s) + max(2 * height - 1, 0)
    return steps * (latency + s / rate)


def chunk_bytes(
    nbytes: float, rate: float, height: int, latency: float,
    lo: int = 4096, hi: int = 4 << 20,
) -> int:
    """Chunk size minimising :func:`pipelined_time`: ``s* = sqrt(m a r / (2h - 1))``,
    clamped to ``[lo, hi]`` and rounded to a multiple of 64 bytes."""
    if height <= 0 or latency <= 0:
        return int(max(lo, min(hi, nbytes)))
    s = math.sqrt(nbytes * latency * rate / (2 * height - 1))
    s = max(lo, min(hi, s, max(nbytes, 1)))
    return max(64, int(s) // 64 * 64)
