"""Graph coarsening for placement search: fusion of chains and cheap ops, then co-location
groups: the algebraic transformation of the thesis "Joint optimization of algebraic
transformation, device placement, and network bandwidth allocation for distributed DNN
training" (iterative operator fusion and co-location).

Kept for the placement strategy (issue 13): no planner path uses it yet; tests cover it.

`coarsen`: contract edges (u, v) to a fixpoint when u has one successor and v one predecessor
(a pure chain), or u is cheap (< alpha) and has one successor, or v is cheap and has one
predecessor. Never when u fans out and v fans in, which keeps the graph acyclic: a contracted
edge is the only path between its ends. Costs, parameter bytes and member ops add up; parallel
edges merge (bytes add). O((V + E) * rounds), rounds small in practice.

`colocate`: rank(v) = cost(v) + max over successors s of (rank(s) + bytes(v, s) / bandwidth)
(upward rank, HEFT-style); every node keeps its edge to its highest-rank successor; weakly
connected components of the kept edges are co-location groups; groups cheaper than beta join
the neighbouring group they exchange most bytes with. O(V + E).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from topoctl.graph.cost import OpCost
from topoctl.graph.ops import OpGraph


@dataclass
class Node:
    id: str
    ops: list[str]
    cost: float  # forward + backward seconds
    param_bytes: int = 0


@dataclass
class CoarseGraph:
    nodes: dict[str, Node]
    edges: dict[tuple[str, str], int] = field(default_factory=dict)  # (u, v) -> bytes

    def succ(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {n: set() for n in self.nodes}
        for u, v in self.edges:
            out[u].add(v)
        return out

    def pred(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {n: set() for n in self.nodes}
        for u, v in self.edges:
            out[v].add(u)
        return out

    def topological(self) -> list[str]:
        pred = {n: len(p) for n, p in self.pred().items()}
        succ = self.succ()
        ready = [n for n in self.nodes if pred[n] == 0]
        out = []
        while ready:
            n = ready.pop()
            out.append(n)
            for s in sorted(succ[n]):
                pred[s] -= 1
                if pred[s] == 0:
                    ready.append(s)
        if len(out) != len(self.nodes):
            raise ValueError("the graph has a cycle")
        return out


def from_opgraph(graph: OpGraph, costs: dict[str, OpCost]) -> CoarseGraph:
    nodes = {o.name: Node(o.name, [o.name], costs[o.name].fwd + costs[o.name].bwd, o.param_bytes)
             for o in graph.ops}
    edges: dict[tuple[str, str], int] = {}
    for u, v, b in graph.edges():
        if u != v:
            edges[(u, v)] = edges.get((u, v), 0) + b
    return CoarseGraph(nodes, edges)


def coarsen(g: CoarseGraph, alpha: float) -> CoarseGraph:
    """Fuse chains and cheap ops (see module docstring); returns a new graph."""
    nodes = {k: Node(n.id, list(n.ops), n.cost, n.param_bytes) for k, n in g.nodes.items()}
    succ: dict[str, dict[str, int]] = {k: {} for k in nodes}  # u -> {v: bytes}
    pred: dict[str, dict[str, int]] = {k: {} for k in nodes}
    for (u, v), b in g.edges.items():
        succ[u][v] = b
        pred[v][u] = b
    order = {k: i for i, k in enumerate(g.topological())}
    changed = True
    while changed:
        changed = False
        for u in sorted(nodes, key=order.__getitem__):
            if u not in nodes:
                continue
            while len(succ[u]) == 1:
                (v,) = succ[u]
                if not (len(pred[v]) == 1 or nodes[u].cost < alpha):
                    break
                _merge(nodes, succ, pred, u, v)
                changed = True
            for v in sorted(succ[u], key=order.__getitem__):
                if v in nodes and len(pred[v]) == 1 and v in succ[u] and nodes[v].cost < alpha:
                    _merge(nodes, succ, pred, u, v)
                    changed = True
    edges = {(u, v): b for u in nodes for v, b in succ[u].items()}
    return CoarseGraph(nodes, edges)


def _merge(nodes, succ, pred, u: str, v: str) -> None:
    """Contract edge (u, v) into u."""
    nu, nv = nodes[u], nodes.pop(v)
    nu.ops += nv.ops
    nu.cost += nv.cost
    nu.param_bytes += nv.param_bytes
    del succ[u][v]
    del pred[v][u]
    for s, b in succ.pop(v).items():
        del pred[s][v]
        succ[u][s] = succ[u].get(s, 0) + b
        pred[s][u] = pred[s].get(u, 0) + b
    for p, b in pred.pop(v).items():
        del succ[p][v]
        succ[p][u] = succ[p].get(u, 0) + b
        pred[u][p] = pred[u].get(p, 0) + b


def colocate(g: CoarseGraph, bandwidth: float, beta: float = 0.0) -> list[list[str]]:
    """Co-location groups (lists of node ids, each in topological order)."""
    order = g.topological()
    pos = {n: i for i, n in enumerate(order)}
    succ: dict[str, dict[str, int]] = {n: {} for n in g.nodes}
    for (u, v), b in g.edges.items():
        succ[u][v] = b
    rank: dict[str, float] = {}
    for n in reversed(order):
        rank[n] = g.nodes[n].cost + max((rank[s] + b / bandwidth for s, b in succ[n].items()),
                                        default=0.0)
    parent = {n: n for n in g.nodes}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb, key=pos.__getitem__)] = min(ra, rb, key=pos.__getitem__)

    for n in order:
        if succ[n]:
            best = max(succ[n], key=lambda s: (rank[s] + succ[n][s] / bandwidth, -pos[s]))
            union(n, best)
    groups: dict[str, list[str]] = {}
    for n in order:
        groups.setdefault(find(n), []).append(n)
    if beta > 0:
        traffic: dict[tuple[str, str], int] = {}
        for (u, v), b in g.edges.items():
            gu, gv = find(u), find(v)
            if gu != gv:
                for a, c in ((gu, gv), (gv, gu)):
                    traffic[(a, c)] = traffic.get((a, c), 0) + b
        for root in list(groups):
            cost = sum(g.nodes[n].cost for n in groups[root])
            if cost >= beta:
                continue
            nbrs = [(b, c) for (a, c), b in traffic.items() if a == root and c in groups]
            if nbrs:
                _, target = max(nbrs)
                groups[target] += groups.pop(root)
    return [sorted(m, key=pos.__getitem__) for m in groups.values()]
