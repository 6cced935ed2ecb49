"""The simulator's Network built from a cluster fabric and a routing: each direction of a
cable (or of a bundle of parallel cables) is one Link in bytes/s; routes follow `NextHops`."""

from __future__ import annotations

from topoctl.sim.network import Link, Network, Routes
from topoctl.sim.routing import NextHops
from topoctl.spec.cluster import FabricGraph


def arc_id(u: str, v: str) -> str:
    return f"{u}>{v}"


def network_from_fabric(graph: FabricGraph, hops: NextHops,
                        rate_caps: dict[tuple[str, str], float] | None = None) -> Network:
    """Links in bytes/s (the fabric gives bit/s); `rate_caps` in bytes/s per (src, dst)."""
    links: dict[str, Link] = {}
    for (u, v), cables in hops.bundles.items():
        lid = arc_id(u, v)
        links[lid] = Link(lid, u, v, sum(c.capacity for c in cables) / 8.0,
                          min(c.latency for c in cables))

    def route(src: str, dst: str) -> Routes:
        nodes = hops.path_nodes(src, dst)
        return [(1.0, tuple(arc_id(a, b) for a, b in zip(nodes, nodes[1:], strict=False)))]

    return Network(links, route, dict(rate_caps or {}))
