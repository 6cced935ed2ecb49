"""Inputs of the bandwidth LP from a strategy: the iteration's traffic matrix (from its task
DAG) and candidate paths per pair on the fabric (the routed path plus one-detour alternatives).
Pure functions; O(tasks + steps) for the matrix, O(pairs * degree * path length) for paths."""

from __future__ import annotations

from collections.abc import Iterable

from topoctl.sim.fabric import arc_id
from topoctl.sim.routing import NextHops, RoutingError
from topoctl.sim.tasks import Collective, Task, Transfer

Pair = tuple[str, str]


def traffic_matrix(tasks: Iterable[Task]) -> dict[Pair, float]:
    """Bytes per (src, dst) host pair in one iteration: transfers plus every collective step."""
    out: dict[Pair, float] = {}
    for t in tasks:
        if isinstance(t, Transfer):
            if t.src != t.dst:
                out[(t.src, t.dst)] = out.get((t.src, t.dst), 0.0) + t.size
        elif isinstance(t, Collective):
            sc = t.schedule.scale
            for s in t.schedule.steps:
                if s.src != s.dst:
                    out[(s.src, s.dst)] = out.get((s.src, s.dst), 0.0) + s.size * sc
    return out


def candidate_paths(hops: NextHops, pairs: Iterable[Pair],
                    detours: bool = True) -> dict[Pair, list[tuple[str, ...]]]:
    """Per pair: the routed (shortest) path first, then on direct fabrics one path per other
    neighbour `m` of the source: s -> m, then m's own routed path to d, kept when it does not
    come back through s and is at most one hop longer than the shortest. Forwarding hosts route
    by destination only (main table), so these are exactly the paths packets take when the
    source alone splits its traffic (policy routing for locally originated packets)."""
    direct = hops.graph.kind == "direct" and detours
    nbrs: dict[str, list[str]] = {}
    for (u, v) in sorted(hops.bundles):
        nbrs.setdefault(u, []).append(v)
    out: dict[Pair, list[tuple[str, ...]]] = {}
    for s, d in pairs:
        nodes = hops.path_nodes(s, d)
        cands = [_arcs(nodes)]
        if direct:
            for m in nbrs.get(s, []):
                if m == nodes[1]:
                    continue
                try:
                    rest = hops.path_nodes(m, d) if m != d else [d]
                except RoutingError:
                    continue
                if s in rest or len(rest) > len(nodes):
                    continue
                cands.append(_arcs([s] + rest))
        out[(s, d)] = cands
    return out


def _arcs(nodes: list[str]) -> tuple[str, ...]:
    return tuple(arc_id(a, b) for a, b in zip(nodes, nodes[1:], strict=False))
