"""TotientPerms: AllReduce rings over Z_n and the search for their strides (TopoOpt, NSDI'23).

A ring of stride p over n servers links i -> (i + p) mod n. It is one ring through all n servers
iff gcd(p, n) = 1 (there are phi(n)/2 such rings up to direction, hence "totient"); a group of g
servers laid out with placement stride s = n/g (members o, o+s, o+2s, ...) gets one ring per
group from every physical stride p = s*k with gcd(k, g) = 1. A ring is used in both directions,
so each chosen stride costs 2 ports per server and makes the fabric the circulant graph
C_n(+-p1, ..., +-pr), which is vertex-transitive: every distance question is a BFS from 0.

`geometric_strides` is the authors' rule (strides spread geometrically between the smallest and
the largest candidate); `search_strides` does better by minimising the (traffic-weighted) mean
hop count, then the diameter, over candidate sets: exhaustively when the sets are few, else by
best-improvement coordinate descent from the geometric set (a local optimum, never worse than
the geometric rule since it starts there). For n=128 and 2 rings: geometric {1,13} has
diameter 10, the search finds {1,15}-like sets of diameter 8, which meets the Moore-type bound
for 4-regular circulants (ceil((sqrt(2n-1)-1)/2) = 8).

Complexity: one evaluation is a BFS on the circulant, O(n r) (numpy, vectorised per level);
exhaustive search O(C(m, r) n r) for m candidates, capped by `exhaustive_limit`; descent
O(passes * r * m * n r). No I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from topoagent.protocol import TopoError


class TopologyError(TopoError):
    """A topology request that cannot be met (n, degree, group size, ports)."""


def placement_stride(n: int, g: int) -> int:
    """Servers between consecutive members of a group of size g laid out on Z_n (g | n)."""
    if g < 2 or g > n or n % g:
        raise TopologyError(f"group size {g} cannot be laid out on {n} servers: it must divide "
                            f"{n} and be at least 2")
    return n // g


def candidate_strides(n: int, g: int | None = None) -> list[int]:
    """Physical strides p in [1, n/2] whose rings are single rings through each group of size g
    (default g = n): p = (n/g) k with gcd(k, g) = 1. p and n - p give the same bidirectional
    ring, so only p <= n/2 is listed. O(n log n)."""
    g = n if g is None else g
    s = placement_stride(n, g)
    return [s * k for k in range(1, g // 2 + 1) if math.gcd(k, g) == 1]


def ring_cables(n: int, p: int) -> list[tuple[int, int]]:
    """The n cables of a stride-p ring: (i, i+p mod n). Every server gets 2 ends (for p = n/2
    the two cables of a pair are parallel)."""
    return [(i, (i + p) % n) for i in range(n)]


def _levels(n: int, strides: Sequence[int]) -> list[int]:
    """BFS levels of C_n(+-strides) from 0 as n-bit sets (bit k: offset k). Rotating a Python
    int is one shift-or-mask, so a level costs O(r * n / 64) word operations."""
    mask = (1 << n) - 1
    shifts = sorted({p % n for p in strides} | {(-p) % n for p in strides} - {0})
    seen = frontier = 1
    levels = [1]
    while frontier:
        nxt = 0
        for s in shifts:
            nxt |= ((frontier << s) | (frontier >> (n - s))) & mask
        frontier = nxt & ~seen
        seen |= frontier
        if frontier:
            levels.append(frontier)
    return levels


def circulant_distances(n: int, strides: Sequence[int]) -> np.ndarray:
    """Hop distance from server 0 to every server in C_n(+-strides) (-1: unreachable). By
    vertex-transitivity dist(i, j) = dist[(j - i) mod n]. O(n * diameter)."""
    dist = np.full(n, -1, dtype=np.int64)
    for level, bits in enumerate(_levels(n, strides)):
        b = np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
        dist[np.unpackbits(b, bitorder="little")[:n].astype(bool)] = level
    return dist


@dataclass(frozen=True)
class StrideScore:
    """How good a stride set is: diameter, mean hop count and traffic-weighted mean hop count of its
    circulant graph."""

    strides: tuple[int, ...]
    diameter: int  # -1 if disconnected
    mean_hops: float  # uniform over all ordered pairs of distinct servers
    weighted_hops: float  # traffic-weighted mean (= mean_hops without traffic)

    @property
    def key(self) -> tuple:
        """Lower is better: connected first, then weighted hops, then diameter, then strides."""
        return (self.diameter < 0, round(self.weighted_hops, 9), self.diameter, self.strides)


def score(n: int, strides: Sequence[int], weights: np.ndarray | None = None) -> StrideScore:
    """Diameter, mean and traffic-weighted mean hop count of C_n(+-strides); `weights[k]` is
    the traffic between servers k apart (offset k, any direction). O(n * diameter)."""
    st = tuple(sorted(strides))
    if n == 1:
        return StrideScore(st, 0, 0.0, 0.0)
    levels = _levels(n, strides)
    if sum(b.bit_count() for b in levels) < n:
        return StrideScore(st, -1, math.inf, math.inf)
    mean = sum(i * b.bit_count() for i, b in enumerate(levels)) / (n - 1)
    if weights is None or weights[1:].sum() <= 0:
        wmean = mean
    else:
        dist = circulant_distances(n, strides)
        w = weights[1:]
        wmean = float((w * dist[1:]).sum() / w.sum())
    return StrideScore(st, len(levels) - 1, mean, wmean)


def geometric_strides(n: int, rings: int, g: int | None = None) -> list[int]:
    """The authors' rule (hipersys-team/FlexFlow network.cc): with candidates c (coprime with
    g, scaled by the placement stride, between min and max = n - s), ratio = (max/min)^(1/r);
    stride i is the smallest unused candidate >= min * ratio^i. Reference values: (128, 2) ->
    [1, 13]; (128, 3) -> [1, 7, 27]; (128, 4) -> [1, 5, 13, 39]. O(n r)."""
    g = n if g is None else g
    s = placement_stride(n, g)
    cands = [s * k for k in range(1, g) if math.gcd(k, g) == 1]
    if rings <= 0:
        return []
    lo, hi = cands[0], cands[-1]
    ratio = (hi / lo) ** (1.0 / rings)
    out: list[int] = []
    for i in range(rings):
        target = lo * ratio ** i
        pick = next((c for c in cands if c >= target - 1e-9 and _canon(n, c) not in out), None)
        if pick is None:
            pick = next((c for c in cands if _canon(n, c) not in out), None)
        if pick is None:
            break
        out.append(_canon(n, pick))
    return out


def _canon(n: int, p: int) -> int:
    p %= n
    return min(p, n - p)


def search_strides(n: int, rings: int, g: int | None = None,
                   weights: np.ndarray | None = None, fixed: Sequence[int] = (),
                   exhaustive_limit: int = 20000, max_passes: int = 20) -> list[int]:
    """`rings` strides (sorted) for groups of size g on Z_n minimising `StrideScore.key`.

    `fixed` strides are always part of the set (e.g. 1, the ring that keeps the fabric
    connected); they count towards `rings`. With fewer distinct candidates than rings, the
    remaining rings reuse non-coprime strides (several shorter cycles: still 2 ports per
    server, still shorter paths), then repeat strides (parallel cables). Deterministic."""
    g = n if g is None else g
    fixed = [_canon(n, p) for p in fixed]
    if rings < len(fixed):
        raise TopologyError(f"{rings} ring(s) cannot hold the required strides {fixed}")
    cands = [c for c in candidate_strides(n, g) if c not in fixed]
    free = rings - len(fixed)
    if free == 0:
        return sorted(fixed)
    if len(cands) < free:
        # too few distinct strides: any other stride still adds useful cables
        extra = [p for p in range(1, n // 2 + 1) if p not in fixed and p not in cands]
        cands = cands + extra
    if len(cands) < free:
        # n tiny: repeat strides (parallel cables add bandwidth, not reach)
        base = sorted(set(fixed) | set(cands)) or [1]
        return sorted(fixed + cands + [base[i % len(base)] for i in range(free - len(cands))])
    if math.comb(len(cands), free) <= exhaustive_limit:
        best = min((score(n, fixed + list(c), weights) for c in
                    itertools.combinations(cands, free)), key=lambda s: s.key)
        return list(best.strides)
    start = [p for p in geometric_strides(n, rings, g) if p not in fixed][:free]
    for c in cands:  # pad if geometric fell short (fixed strides took its picks)
        if len(start) >= free:
            break
        if c not in start:
            start.append(c)
    cur = score(n, fixed + start, weights)
    for _ in range(max_passes):
        improved = False
        for i in range(free):
            cur_free = [p for p in cur.strides if p not in fixed] if len(set(cur.strides)) == \
                len(cur.strides) else start
            for c in cands:
                if c in cur_free:
                    continue
                trial = cur_free[:i] + [c] + cur_free[i + 1:]
                s = score(n, fixed + trial, weights)
                if s.key < cur.key:
                    cur, improved = s, True
                    cur_free = trial
            start = cur_free
        if not improved:
            break
    return list(cur.strides)


def decompose(n: int, strides: Sequence[int], target: int) -> list[int]:
    """Coin change over Z_n: the fewest signed physical strides (+-p for p in `strides`) whose
    sum is `target` mod n, i.e. the hops a "virtual" stride takes on the fabric (every hop is a
    forwarding step at an intermediate server). BFS from 0: O(n r); raises TopologyError if
    the strides do not generate `target`. Ties go to the smallest stride first."""
    target %= n
    coins = sorted({p % n for p in strides} | {(-p) % n for p in strides} - {0},
                   key=lambda c: (min(c, n - c), c))
    prev = {0: (None, 0)}
    todo = [0]
    for v in todo:
        if v == target:
            break
        for c in coins:
            w = (v + c) % n
            if w not in prev:
                prev[w] = (v, c)
                todo.append(w)
    if target not in prev:
        raise TopologyError(f"stride {target} is not reachable with strides {list(strides)} "
                            f"on {n} servers")
    out = []
    v = target
    while v != 0:
        u, c = prev[v]
        out.append(c if c <= n // 2 else c - n)
        v = u
    return out[::-1]
