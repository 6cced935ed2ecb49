"""Routing over a cabled fabric with host forwarding (used by TopoOpt, NSDI'23, section 4.3
"routing", but general: any multigraph of cables): equal-cost multipath next hops and paths, and
k shortest paths for model-parallel demands. TopoOpt's coin-change decomposition of a virtual
stride into physical ones is the ring structure's own: `topoctl.topoopt.totient.decompose`.

Host forwarding makes every server a router: a packet to t leaving s may take any neighbour v
with dist(v, t) = dist(s, t) - 1 (ECMP). Nodes are integers 0..n-1, cables (a, b) pairs
(parallel cables allowed: a neighbour's weight is its number of cables). No I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import networkx as nx
import numpy as np

__all__ = ["ecmp_next_hops", "ecmp_paths", "k_shortest_paths", "neighbour_counts"]


def neighbour_counts(n: int, cables: Sequence[tuple[int, int]]) -> list[dict[int, int]]:
    """Per server: neighbour -> number of cables to it."""
    out: list[dict[int, int]] = [{} for _ in range(n)]
    for a, b in cables:
        out[a][b] = out[a].get(b, 0) + 1
        out[b][a] = out[b].get(a, 0) + 1
    return out


def ecmp_next_hops(dist: np.ndarray, nbrs: list[dict[int, int]], src: int,
                   dst: int) -> list[tuple[int, int]]:
    """Neighbours of `src` on a shortest path to `dst`, each with its cable count (the weight
    its share of traffic gets). `dist` is the all-pairs hop matrix. O(degree)."""
    if src == dst:
        return []
    want = dist[src, dst] - 1
    return [(v, c) for v, c in sorted(nbrs[src].items()) if dist[v, dst] == want]


def ecmp_paths(dist: np.ndarray, nbrs: list[dict[int, int]], src: int, dst: int,
               limit: int = 8) -> list[tuple[float, list[int]]]:
    """Shortest paths src -> dst with the share of traffic ECMP gives each (hop by hop split
    in proportion to cable counts); at most `limit` paths (the heaviest), shares renormalised.
    O(limit * diameter * degree)."""
    paths: list[tuple[float, list[int]]] = [(1.0, [src])]
    done: list[tuple[float, list[int]]] = []
    while paths:
        nxt = []
        for share, p in paths:
            if p[-1] == dst:
                done.append((share, p))
                continue
            hops = ecmp_next_hops(dist, nbrs, p[-1], dst)
            tot = sum(c for _, c in hops)
            nxt += [(share * c / tot, p + [v]) for v, c in hops]
        nxt.sort(key=lambda x: (-x[0], x[1]))
        paths = nxt[:limit]
    tot = sum(s for s, _ in done)
    return [(s / tot, p) for s, p in done]


def k_shortest_paths(n: int, cables: Sequence[tuple[int, int]], src: int, dst: int,
                     k: int) -> list[list[int]]:
    """The k shortest simple paths (Yen's algorithm, networkx.shortest_simple_paths),
    shortest first, ties in a deterministic order. O(k n (n + E)) worst case."""
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((a, b) for a, b in cables if a != b)
    return [list(p) for p in itertools.islice(nx.shortest_simple_paths(g, src, dst), k)]
