"""Graph coarsening for placement search: fusion of chains and cheap ops, then co-location
groups: the algebraic transformation of the thesis "Joint optimization of algebraic
transformation, device placement, and network bandwidth allocation for distributed DNN
training" (iterative operator fusion and co-location).

Used by the `placement` and `pipeline` strategies (`topoctl.strategies.placement`) before the
placement search, and by `bench/placement/search.py`.

`coarsen`: contract edges (u, v) to a fixpoint when u has one successor and v one predecessor
(a pure chain), or u is cheap (< alpha) and has one successor, or v is cheap and has one
predecessor. Never when u fans out and v fans in, which keeps the graph acyclic: a contracted
edge is the only path between its ends. Costs, parameter bytes and member ops add up; parallel
edges merge (bytes add). O((V + E) * rounds), rounds small in practice.

`colocate`: rank(v) = cost(v) + max over successors s of (rank(s) + bytes(v, s) / bandwidth)
(upward rank, HEFT-style); every node keeps its edge to its highest-rank successor; weakly
connected components of the kept edges are co-location groups; groups cheaper than beta join
the neighbouring group they exchange most bytes with. O(V + E).

`quotient`: contract each group into one node. Contracting groups can close a cycle (a group
that both feeds and is fed by another through a third node), so the strongly connected
components of the group graph are merged too (its condensation is acyclic by construction).
O(V + E) with networkx's SCC.

`coarsen_graph`: the whole transformation with thresholds derived from the cost distribution
(`thresholds`) and a report of the sizes before and after (`CoarsenStats`); the simulated
makespan change it causes is measured by the placement strategy and the bench, which schedule
both graphs on the same devices.

Thresholds (`thresholds`): alpha = the median cost of the ops that cost anything (views cost 0
and are always cheap): an op cheaper than half of the real ops is "cheap", so fusion removes
the long tail of element-wise ops and views around every matmul/conv but never merges two
heavy ops unless they form a pure chain. beta = total cost / (4 * `target`) (default target 64
groups): a co-location group worth less than a quarter of an average group's share is too small
to be worth a placement decision of its own. gamma = total cost / `parts` (default 32) caps
every fused node and group: the thesis's rules would fuse a sequential model (VGG, an MLP)
into a single node, which is right for the makespan of one pass but leaves nothing to place
when memory or pipelining needs the model split; 32 parts let 8 devices balance to within
about a quarter of a stage.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import networkx as nx

from topoctl.graph.cost import OpCost
from topoctl.graph.ops import OpGraph


@dataclass
class Node:
    """One coarse node: the fx ops it groups, their forward + backward seconds, parameter and kept-
    activation bytes."""

    id: str
    ops: list[str]
    cost: float  # forward + backward seconds
    param_bytes: int = 0
    act_bytes: int = 0  # activations kept for the backward pass (outputs of the member ops)


@dataclass
class CoarseGraph:
    """A DAG of coarse nodes with the bytes each edge carries."""

    nodes: dict[str, Node]
    edges: dict[tuple[str, str], int] = field(default_factory=dict)  # (u, v) -> bytes

    def succ(self) -> dict[str, set[str]]:
        """Node -> its successors."""
        out: dict[str, set[str]] = {n: set() for n in self.nodes}
        for u, v in self.edges:
            out[u].add(v)
        return out

    def pred(self) -> dict[str, set[str]]:
        """Node -> its predecessors."""
        out: dict[str, set[str]] = {n: set() for n in self.nodes}
        for u, v in self.edges:
            out[v].add(u)
        return out

    def topological(self) -> list[str]:
        """The nodes in a topological order (ValueError when the graph has a cycle)."""
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
    """The op graph as an uncoarsened CoarseGraph: one node per op, costs from `costs`, edges with
    their bytes."""
    nodes = {o.name: Node(o.name, [o.name], costs[o.name].fwd + costs[o.name].bwd, o.param_bytes,
                          0 if o.is_view else o.out_bytes)
             for o in graph.ops}
    edges: dict[tuple[str, str], int] = {}
    for u, v, b in graph.edges():
        if u != v:
            edges[(u, v)] = edges.get((u, v), 0) + b
    return CoarseGraph(nodes, edges)


def coarsen(g: CoarseGraph, alpha: float, max_cost: float = math.inf) -> CoarseGraph:
    """Fuse chains and cheap ops (see module docstring); returns a new graph. No fused node
    grows beyond `max_cost` (the cap that keeps a sequential model from collapsing into one
    node, which would leave a pipeline nothing to place)."""
    nodes = {k: Node(n.id, list(n.ops), n.cost, n.param_bytes, n.act_bytes)
             for k, n in g.nodes.items()}
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
                if nodes[u].cost + nodes[v].cost > max_cost:
                    break
                _merge(nodes, succ, pred, u, v)
                changed = True
            for v in sorted(succ[u], key=order.__getitem__):
                if (v in nodes and len(pred[v]) == 1 and v in succ[u] and nodes[v].cost < alpha
                        and nodes[u].cost + nodes[v].cost <= max_cost):
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
    nu.act_bytes += nv.act_bytes
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


def colocate(g: CoarseGraph, bandwidth: float, beta: float = 0.0,
             max_cost: float = math.inf) -> list[list[str]]:
    """Co-location groups (lists of node ids, each in topological order); a kept edge that
    would make a group cost more than `max_cost` is dropped."""
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
    gcost = {n: g.nodes[n].cost for n in g.nodes}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb and gcost[ra] + gcost[rb] <= max_cost:
            lo, hi = sorted((ra, rb), key=pos.__getitem__)
            parent[hi] = lo
            gcost[lo] += gcost[hi]

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
                if cost + sum(g.nodes[n].cost for n in groups[target]) <= max_cost:
                    groups[target] += groups.pop(root)
    return [sorted(m, key=pos.__getitem__) for m in groups.values()]


def quotient(g: CoarseGraph, groups: list[list[str]]) -> CoarseGraph:
    """Contract every group into one node (named after its first member); strongly connected
    components of the result are merged so that it stays acyclic (see module docstring)."""
    order = {n: i for i, n in enumerate(g.topological())}
    owner = {n: i for i, grp in enumerate(groups) for n in grp}
    if sorted(owner) != sorted(g.nodes):
        raise ValueError("groups must partition the nodes")
    dg = nx.DiGraph()
    dg.add_nodes_from(range(len(groups)))
    dg.add_edges_from({(owner[u], owner[v]) for u, v in g.edges if owner[u] != owner[v]})
    comp: dict[int, int] = {}
    for k, scc in enumerate(nx.strongly_connected_components(dg)):
        for i in scc:
            comp[i] = k
    members: dict[int, list[str]] = {}
    for n in g.nodes:
        members.setdefault(comp[owner[n]], []).append(n)
    nodes: dict[str, Node] = {}
    name: dict[int, str] = {}
    for k, ms in members.items():
        ms.sort(key=order.__getitem__)
        name[k] = ms[0]
        ns = [g.nodes[m] for m in ms]
        nodes[ms[0]] = Node(ms[0], [op for x in ns for op in x.ops], sum(x.cost for x in ns),
                            sum(x.param_bytes for x in ns), sum(x.act_bytes for x in ns))
    edges: dict[tuple[str, str], int] = {}
    for (u, v), b in g.edges.items():
        a, c = name[comp[owner[u]]], name[comp[owner[v]]]
        if a != c:
            edges[(a, c)] = edges.get((a, c), 0) + b
    nodes = dict(sorted(nodes.items(), key=lambda kv: order[kv[0]]))
    return CoarseGraph(nodes, dict(sorted(edges.items(), key=lambda kv: (order[kv[0][0]],
                                                                        order[kv[0][1]]))))


def thresholds(g: CoarseGraph, target: int = 64, parts: int = 32
               ) -> tuple[float, float, float]:
    """(alpha, beta, gamma) from the cost distribution (see module docstring)."""
    real = [n.cost for n in g.nodes.values() if n.cost > 0]
    alpha = statistics.median(real) if real else 0.0
    beta = sum(real) / (4 * max(1, target))
    gamma = sum(real) / max(1, parts) if real else math.inf
    return alpha, beta, gamma


@dataclass(frozen=True)
class CoarsenStats:
    """Graph sizes before fusion, after fusion, and after co-location (the placement graph)."""

    ops_before: int
    edges_before: int
    ops_fused: int
    edges_fused: int
    ops_after: int
    edges_after: int
    alpha: float
    beta: float
    gamma: float

    def to_dict(self) -> dict:
        """The statistics as a plain dict (for the plan's metadata)."""
        return dict(self.__dict__)


def coarsen_graph(g: CoarseGraph, bandwidth: float, alpha: float | None = None,
                  beta: float | None = None, target: int = 64, parts: int = 32
                  ) -> tuple[CoarseGraph, CoarsenStats]:
    """Fusion to a fixpoint, then co-location groups contracted into nodes: the graph the
    placement search works on. `bandwidth` (bytes/s, the slowest link) prices edges in the
    rank rule. Costs, parameter and activation bytes and member ops are conserved.
    O((V + E) * rounds)."""
    a, b, gamma = thresholds(g, target, parts)
    alpha = a if alpha is None else alpha
    beta = b if beta is None else beta
    fused = coarsen(g, alpha, gamma)
    out = quotient(fused, colocate(fused, bandwidth, beta, gamma))
    return out, CoarsenStats(len(g.nodes), len(g.edges), len(fused.nodes), len(fused.edges),
                             len(out.nodes), len(out.edges), alpha, beta, gamma)
