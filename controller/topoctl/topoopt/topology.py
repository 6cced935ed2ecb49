"""TopologyFinder (TopoOpt, NSDI'23, section 4 and Algorithm 1): the direct-connect cabling of
n servers with d ports each for one job's traffic.

1. Degree split: T_dp = sum over AllReduce groups of S (2g - 1) (the paper's volume estimate)
   times the number of such groups, T_mp = total model-parallel bytes; the AllReduce share is
   d * T_dp / (T_dp + T_mp) rounded to an even number, at least 2 (a bidirectional ring) and
   all of d when there is no model-parallel traffic or `all_allreduce` is set.
2. AllReduce rings (TotientPerms, `topoctl.topoopt.totient`): each group size gets one ring,
   the heaviest the rest; strides are searched for the least traffic-weighted mean hop count
   (groups without their own ring and model-parallel demand weigh their offsets), then the
   diameter. If no ring spans all servers (the heaviest group is not the whole cluster), stride
   1 is kept, which guarantees connectivity.
3. Model-parallel links: repeated maximum-weight matching on the remaining demand
   (`topoctl.topoopt.matching`); ports still free afterwards are paired "across" (i with the
   free server half the list away) so no port is wasted and the diameter shrinks.
4. Ports: ring t uses port 2t for its cable to i + p and port 2t + 1 for the one from i - p
   (a patch-panel map humans can follow); other cables take the next free port.

Bound: every server ends with at most d cables (asserted); the graph is connected (asserted).
Complexity: the stride search (see totient) plus (d - d_ar) matchings, plus one all-pairs BFS
O(n (n + nd)) for the reported diameter and mean hop count. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from topoctl.topoopt.matching import mp_links
from topoctl.topoopt.totient import (
    TopologyError,
    candidate_strides,
    placement_stride,
    ring_cables,
    search_strides,
)


@dataclass(frozen=True)
class ArGroup:
    """`size` servers per group, laid out with stride n/size; there are n/size such groups
    (one per offset), each all-reducing `bytes` per iteration."""

    size: int
    bytes: float


@dataclass(frozen=True)
class Cable:
    """One cable between server `a`'s port `a_port` and server `b`'s port `b_port`; `kind` says why
    it exists (ring, mp matching, fill)."""

    a: int
    a_port: int
    b: int
    b_port: int
    kind: str  # "ring" | "mp" | "fill"
    stride: int = 0  # rings: the stride


@dataclass
class Topology:
    """The TopologyFinder's result: ring strides, every cable with its ports, the degree split,
    diameter and mean hop count."""

    n: int
    d: int
    strides: list[int]  # physical ring strides (each 2 ports per server)
    ring_groups: dict[int, list[int]]  # group size -> strides forming its rings
    allreduce_degree: int
    mp_degree: int
    cables: list[Cable]
    diameter: int
    mean_hops: float
    matching: str = ""
    volumes: dict[str, float] = field(default_factory=dict)

    def adjacency(self) -> list[list[int]]:
        """Per server, the servers it is cabled to (once per cable)."""
        adj: list[list[int]] = [[] for _ in range(self.n)]
        for c in self.cables:
            adj[c.a].append(c.b)
            adj[c.b].append(c.a)
        return adj

    def to_dict(self) -> dict:
        """The topology as plain data (strides, rings, degrees, cables, diameter, mean hops)."""
        return {"n": self.n, "d": self.d, "strides": self.strides,
                "rings": {str(g): s for g, s in self.ring_groups.items()},
                "allreduce_degree": self.allreduce_degree, "mp_degree": self.mp_degree,
                "diameter": self.diameter, "mean_hops": round(self.mean_hops, 6),
                "matching": self.matching, "volumes": self.volumes,
                "links": [[c.a, c.a_port, c.b, c.b_port, c.kind] +
                          ([c.stride] if c.kind == "ring" else []) for c in self.cables]}


def distances(n: int, cables: Sequence[tuple[int, int]]) -> np.ndarray:
    """All-pairs hop counts (inf: unreachable). O(n (n + E)) (scipy BFS)."""
    if not cables:
        d = np.full((n, n), np.inf)
        np.fill_diagonal(d, 0)
        return d
    a = np.array([(x, y) for x, y in cables] + [(y, x) for x, y in cables])
    m = csr_matrix((np.ones(len(a)), (a[:, 0], a[:, 1])), shape=(n, n))
    return shortest_path(m, directed=False, unweighted=True)


def degree_split(d: int, t_dp: float, t_mp: float, all_allreduce: bool = False) -> int:
    """Ports for AllReduce rings: even, >= 2, proportional to volume (paper section 4.2)."""
    if d < 2:
        raise TopologyError(f"a direct-connect fabric needs at least 2 ports per server (one "
                            f"bidirectional ring); d = {d}")
    if all_allreduce or t_mp <= 0:
        return d - d % 2
    share = d * t_dp / (t_dp + t_mp) if t_dp > 0 else 0.0
    return max(2, min(d - d % 2, 2 * int(round(share / 2))))


def find_topology(n: int, d: int, groups: Sequence[ArGroup] = (),
                  mp_demand: Mapping[tuple[int, int], float] | None = None,
                  all_allreduce: bool = False, ports: int | None = None,
                  require_rings: bool = False) -> Topology:
    """The cabling for `groups` (AllReduce) and `mp_demand` ((i, j) -> bytes) on n servers
    with d ports each (`ports`: what a server physically has, default d). `require_rings`:
    raise unless every group size gets its own ring (else extra sizes use virtual strides,
    routed over the physical ones)."""
    if n < 2:
        raise TopologyError(f"a fabric needs at least 2 servers, got n = {n}")
    if ports is not None and d > ports:
        raise TopologyError(f"degree {d} is larger than the {ports} ports a server has")
    for gr in groups:
        placement_stride(n, gr.size)  # raises for sizes that cannot be laid out
    mp_demand = dict(mp_demand or {})
    t_dp = sum(gr.bytes * (2 * gr.size - 1) * (n // gr.size) for gr in groups)
    t_mp = float(sum(mp_demand.values()))
    d_ar = degree_split(d, t_dp, t_mp, all_allreduce)
    rings = d_ar // 2
    # group sizes by volume, heaviest first; one ring each while they fit
    vol: dict[int, float] = {}
    for gr in groups:
        vol[gr.size] = vol.get(gr.size, 0.0) + gr.bytes * (2 * gr.size - 1) * (n // gr.size)
    sizes = sorted(vol, key=lambda g: (-vol[g], g))
    need_full = not sizes or n not in sizes[:rings]
    fit = rings - (1 if need_full and (not sizes or sizes[0] != n) else 0)
    if require_rings and len(sizes) > fit:
        raise TopologyError(
            f"{len(sizes)} group size(s) {sorted(sizes)} need {2 * len(sizes)} ports for their "
            f"own rings" + (" plus 2 for the stride-1 ring that keeps the fabric connected"
                            if need_full else "") + f", but only {d_ar} of {d} are for AllReduce")
    weights = _offset_weights(n, groups, mp_demand, sizes[:max(fit, 0)])
    chosen: list[int] = [1] if need_full else []
    ring_groups: dict[int, list[int]] = {}
    if need_full:
        ring_groups[n] = [1]
    own = sizes[:max(fit, 0)]
    for g in own[1:]:  # the lighter sizes: one ring each
        cands = [c for c in candidate_strides(n, g) if c not in chosen]
        if not cands:
            continue
        best = search_strides(n, len(chosen) + 1, g, weights, fixed=chosen)
        new = [p for p in best if p not in chosen] or cands[:1]
        chosen.append(new[0])
        ring_groups.setdefault(g, []).append(new[0])
    heavy = own[0] if own else n
    if len(chosen) < rings:
        full = search_strides(n, rings, heavy, weights, fixed=chosen)
        extra = list(full)
        for p in chosen:
            extra.remove(p)
        ring_groups.setdefault(heavy, []).extend(extra)
        chosen += extra
    cables: list[Cable] = []
    used = [0] * n
    for t, p in enumerate(chosen):
        for a, b in ring_cables(n, p):
            cables.append(Cable(a, 2 * t, b, 2 * t + 1, "ring", p))
        used = [u + 2 for u in used]
    free = [d - u for u in used]
    mp, method = mp_links(n, mp_demand, d - d_ar, free) if d > d_ar else ([], "")
    for a, b in mp:
        cables.append(Cable(a, used[a], b, used[b], "mp"))
        used[a] += 1
        used[b] += 1
    cables += _fill(n, d, used)
    assert all(u <= d for u in used), "degree exceeded"
    dist = distances(n, [(c.a, c.b) for c in cables])
    if not np.isfinite(dist).all():  # cannot happen: a spanning ring is always present
        raise TopologyError("internal: the fabric is disconnected")
    off = ~np.eye(n, dtype=bool)
    return Topology(n, d, chosen, ring_groups, d_ar, d - d_ar, cables, int(dist.max()),
                    float(dist[off].mean()), method, {"allreduce": t_dp, "model_parallel": t_mp})


def _offset_weights(n: int, groups: Sequence[ArGroup], mp: Mapping[tuple[int, int], float],
                    own: Sequence[int]) -> np.ndarray | None:
    """Traffic per circulant offset: groups without their own ring (their stride-n/g ring
    hops) and model-parallel pairs, plus a uniform base (5 %) so the diameter still counts."""
    w = np.zeros(n)
    for gr in groups:
        if gr.size not in own:
            s = n // gr.size
            w[s] += gr.bytes
            w[n - s] += gr.bytes
    for (a, b), x in mp.items():
        if a != b:
            w[(b - a) % n] += x
            w[(a - b) % n] += x
    tot = w.sum()
    if tot <= 0:
        return None
    w[1:] += 0.05 * tot / (n - 1)
    return w


def _fill(n: int, d: int, used: list[int]) -> list[Cable]:
    """Pair ports left free: servers with a free port, in index order, i with the one half the
    list away (far apart on the rings), repeated while pairs remain. Mutates `used`."""
    out: list[Cable] = []
    while True:
        free = [i for i in range(n) if used[i] < d]
        if len(free) < 2:
            return out
        half = len(free) // 2
        made = 0
        for k in range(half):
            a, b = free[k], free[k + half]
            if used[a] >= d or used[b] >= d:
                continue
            out.append(Cable(a, used[a], b, used[b], "fill"))
            used[a] += 1
            used[b] += 1
            made += 1
        if not made:
            return out
