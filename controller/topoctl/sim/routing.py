"""Shortest-path routing over a cluster fabric (hop count, as OSPF with unit costs or plain L2
switching would give), for the simulator and for rendering host routes.

Direct-connect fabrics: hosts forward for each other (TopoOpt's host forwarding), so any host may
be a transit node. Switched fabrics: only switches are transit; each host is split into a source
and a sink node so that no path crosses a host. One BFS per destination host over the reversed
graph (scipy.sparse.csgraph, C code): O(H * (N + E)) time, an H x N int32 next-hop matrix.
Parallel cables between the same two nodes are one bundle; a pair's traffic takes its
`fabric.graph.lead_cable` (one connection cannot be spread over several cables).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from topoagent.protocol import TopoError
from topoctl.fabric.graph import FabricGraph, FabricLink


class RoutingError(TopoError, ValueError):
    """The fabric cannot carry the job (disconnected hosts); `path` names the YAML path."""

    def __init__(self, path: str, message: str):
        super().__init__(message, path)


@dataclass
class NextHops:
    """Next hop of every node toward every host: `nxt[d, v]` is the node index after v on the
    way to host index d (-1: unreachable, v itself for v = d)."""

    graph: FabricGraph
    names: list[str]  # node index -> node name (split hosts appear twice)
    index_out: dict[str, int]  # where a path from a node starts
    index_in: dict[str, int]  # where a path to a host ends
    host_pos: dict[str, int]  # host -> row of nxt
    nxt: np.ndarray
    bundles: dict[tuple[str, str], list[FabricLink]]  # (u, v) -> cables/ports from u to v

    def path_nodes(self, src: str, dst: str) -> list[str]:
        """The nodes on the routed path from `src` to `dst`, both included."""
        d = self.host_pos[dst]
        v, end = self.index_out[src], self.index_in[dst]
        out = [src]
        while v != end:
            v = int(self.nxt[d, v])
            if v < 0:
                raise RoutingError("fabric", f"{src} cannot reach {dst}")
            out.append(self.names[v])
            if len(out) > len(self.names) + 1:
                raise RoutingError("fabric", f"routing loop from {src} to {dst}")
        return out

    def next_node(self, src: str, dst: str) -> str:
        """The first node after `src` on its route to `dst`."""
        v = int(self.nxt[self.host_pos[dst], self.index_out[src]])
        return self.names[v]

    def transit_hosts(self) -> set[str]:
        """Hosts that forward traffic of others (get ip_forward)."""
        if self.graph.kind != "direct":
            return set()
        h = len(self.graph.hosts)
        nxt = self.nxt[:, :h]
        dest = np.arange(h)[:, None]
        forwarders = np.unique(nxt[(nxt != dest) & (nxt >= 0)])
        # a next hop is a transit host unless it is the destination itself
        return {self.names[int(i)] for i in forwarders}


def bundles_of(graph: FabricGraph) -> dict[tuple[str, str], list[FabricLink]]:
    """(u, v) -> the parallel links between u and v, in both directions."""
    out: dict[tuple[str, str], list[FabricLink]] = {}
    for ln in graph.links:
        out.setdefault((ln.a, ln.b), []).append(ln)
        out.setdefault((ln.b, ln.a), []).append(ln)
    return out


def shortest_next_hops(graph: FabricGraph, required: list[str] | None = None) -> NextHops:
    """Hop-count shortest paths from every node to every host; RoutingError if one of the
    `required` hosts (default: all) cannot reach another of them."""
    hosts = list(graph.hosts)
    h = len(hosts)
    if graph.kind == "direct":
        names = hosts
        index_out = index_in = {x: i for i, x in enumerate(hosts)}
        arcs = []
        for ln in graph.links:
            a, b = index_out[ln.a], index_out[ln.b]
            arcs += [(a, b), (b, a)]
    else:
        sw = list(graph.switches)
        names = hosts + hosts + sw
        index_out = {x: i for i, x in enumerate(hosts)}
        index_in = {x: h + i for i, x in enumerate(hosts)}
        sidx = {x: 2 * h + i for i, x in enumerate(sw)}
        arcs = []
        for ln in graph.links:
            for u, v in ((ln.a, ln.b), (ln.b, ln.a)):
                if u in sidx and v in sidx:
                    arcs.append((sidx[u], sidx[v]))
                elif u in sidx:
                    arcs.append((sidx[u], index_in[v]))
                else:
                    arcs.append((index_out[u], sidx[v]))
    n = len(names)
    if arcs:
        a = np.array(sorted(set(arcs)), dtype=np.int64)
        # reversed graph: an arc v->u for every u->v, so that a search from d finds paths to d
        rev = csr_matrix((np.ones(len(a)), (a[:, 1], a[:, 0])), shape=(n, n))
    else:
        rev = csr_matrix((n, n))
    targets = [index_in[x] for x in hosts]
    _, pred = shortest_path(rev, directed=True, unweighted=True, indices=targets,
                            return_predecessors=True)
    pred = pred.astype(np.int32)
    pred[pred < 0] = -1
    for d, t in enumerate(targets):
        pred[d, t] = t
    pos = {x: i for i, x in enumerate(hosts)}
    req = list(required or hosts)
    need = np.array([index_out[x] for x in req], dtype=np.int64)
    bad = pred[np.ix_([pos[x] for x in req], need)] < 0
    if bad.any():
        d, v = (int(x[0]) for x in np.nonzero(bad))
        cut = [req[int(i)] for i in np.nonzero(bad[d])[0]]
        raise RoutingError("fabric", f"disconnected: {', '.join(cut[:5])} cannot reach {req[d]}"
                           + (f" (and {len(cut) - 5} more)" if len(cut) > 5 else ""))
    return NextHops(graph, names, index_out, index_in, pos, pred,
                    bundles_of(graph))
