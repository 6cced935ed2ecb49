"""Model-parallel links for a direct-connect fabric (TopoOpt, NSDI'23, section 4.2 "MP
sub-topology"): repeated maximum-weight matching on the remaining demand.

Round t pairs servers by a maximum-weight matching on the graph whose edge weights are the
remaining model-parallel demand between two servers (Edmonds' blossom algorithm,
networkx.max_weight_matching, O(V^3) per round); a matched pair gets one cable and its
remaining demand is divided by (cables so far + 1), so heavy pairs may get several cables but
the next round prefers pairs not served yet. Servers whose ports are used up leave the graph.
Only pairs with positive demand are edges (sparse demand stays cheap); above `exact_edges`
edges a greedy matching (heaviest edge first, a 1/2-approximation, O(E log E)) is used instead
of the blossom algorithm, and the choice is reported. Deterministic: ties by server index.
No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

import networkx as nx


def greedy_matching(weights: Mapping[tuple[int, int], float]) -> set[tuple[int, int]]:
    """Heaviest edge first, skipping matched servers: a 1/2-approximate maximum-weight
    matching in O(E log E)."""
    used: set[int] = set()
    out = set()
    for (a, b), w in sorted(weights.items(), key=lambda kv: (-kv[1], kv[0])):
        if w <= 0 or a in used or b in used:
            continue
        used |= {a, b}
        out.add((a, b))
    return out


def exact_matching(weights: Mapping[tuple[int, int], float]) -> set[tuple[int, int]]:
    """Maximum-weight matching (blossom), pairs as (low, high)."""
    g = nx.Graph()
    for (a, b), w in sorted(weights.items()):
        if w > 0:
            g.add_edge(a, b, weight=w)
    return {(min(a, b), max(a, b)) for a, b in nx.max_weight_matching(g)}


def mp_links(n: int, demand: Mapping[tuple[int, int], float], rounds: int,
             free_ports: list[int] | None = None,
             exact_edges: int = 5000) -> tuple[list[tuple[int, int]], str]:
    """Up to `rounds` matchings over servers 0..n-1 for the symmetric model-parallel `demand`
    ((i, j) -> bytes, either direction); `free_ports[i]` caps the cables of server i (default
    `rounds`). Returns (cables as (low, high) pairs, "blossom" or "greedy")."""
    free = list(free_ports) if free_ports is not None else [rounds] * n
    rem: dict[tuple[int, int], float] = {}
    for (a, b), w in demand.items():
        if a == b or w <= 0:
            continue
        key = (min(a, b), max(a, b))
        rem[key] = rem.get(key, 0.0) + float(w)
    count: dict[tuple[int, int], int] = {}
    cables: list[tuple[int, int]] = []
    method = "blossom" if len(rem) <= exact_edges else "greedy"
    for _ in range(rounds):
        live = {k: w for k, w in rem.items() if free[k[0]] > 0 and free[k[1]] > 0 and w > 0}
        if not live:
            break
        match = exact_matching(live) if method == "blossom" else greedy_matching(live)
        if not match:
            break
        for a, b in sorted(match):
            cables.append((a, b))
            free[a] -= 1
            free[b] -= 1
            count[(a, b)] = count.get((a, b), 0) + 1
            rem[(a, b)] = rem[(a, b)] / (count[(a, b)] + 1)
    return cables, method
