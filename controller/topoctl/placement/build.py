"""A `PlacementProblem` from a coarse graph, per-device costs and the fabric's routes.

Devices are groups of hosts (a pipeline stage's data-parallel replicas; one host per group for
a pure pipeline). A group runs a node at the pace of its slowest member; between two groups,
replica r of one talks to replica r of the other, so the bandwidth is the worst of those
routes' bottlenecks and the latency the worst route's. Memory a node keeps on its device
(`node_memory`, the device memory model of `sim.memory` for Adam): 16 bytes per parameter
(weights, gradients, two fp32 moments; in fp16/bf16 also an fp32 master copy) plus its
activations for every micro-batch in flight (GPipe keeps all of them until the backward pass).
O(n * members + groups^2 * replicas * path length)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from topoctl.graph.coarsen import CoarseGraph
from topoctl.placement.problem import PlacementProblem
from topoctl.sim.memory import footprint
from topoctl.sim.network import Network

FP32 = 4  # bytes per parameter: the graph's parameter bytes are fp32


def node_memory(param_bytes: float, act_bytes: float, microbatches: int,
                dtype_bytes: int = FP32) -> float:
    """Bytes a node keeps on its device: parameters with optimizer state plus activations of every
    micro-batch in flight. `dtype_bytes`: the width of `param_bytes`' parameters (fp16/bf16:
    mixed precision, an fp32 master copy beside Adam's moments: 16 bytes per parameter, as
    `topoctl.sim.layout` checks every plan)."""
    return footprint(param_bytes / dtype_bytes, dtype_bytes, act_bytes,
                     mixed_precision=dtype_bytes < FP32, microbatches=microbatches).total


def route_matrix(network: Network, hosts: Sequence[str]
                 ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Per host pair: bottleneck bandwidth (bytes/s, weighted paths add) and latency."""
    bw: dict[tuple[str, str], float] = {}
    lat: dict[tuple[str, str], float] = {}
    for a in hosts:
        for b in hosts:
            if a == b:
                continue
            routes = network.routes(a, b)
            wsum = sum(w for w, _ in routes) or 1.0
            # weighted multipath: the share w of the bytes crosses path p at its bottleneck
            rate = min((min(network.links[x].capacity for x in path) / (w / wsum)
                        for w, path in routes if path), default=math.inf)
            bw[(a, b)] = rate
            lat[(a, b)] = max((network.latency(path) for _, path in routes), default=0.0)
    return bw, lat


def build_problem(g: CoarseGraph, groups: Sequence[Sequence[str]],
                  op_cost: dict[str, dict[str, float]], capacity: dict[str, float],
                  network: Network, microbatches: int, scale: float = 1.0,
                  cost_scale: float | None = None, dtype_bytes: int = FP32) -> PlacementProblem:
    """`op_cost[host][op]`: seconds (forward + backward) of one op on that host at the graph's
    batch; `scale` multiplies costs and bytes (e.g. micro-batch / captured batch);
    `cost_scale`, when given, multiplies the costs instead (1: `op_cost` was measured at the
    micro-batch); `dtype_bytes`: the width of the graph's parameters (`node_memory`)."""
    cscale = scale if cost_scale is None else cost_scale
    order = g.topological()
    pos = {n: i for i, n in enumerate(order)}
    hosts = [h for grp in groups for h in grp]
    bw, lat = route_matrix(network, hosts)
    dv = len(groups)
    cost = [[cscale * max(sum(op_cost[h][o] for o in g.nodes[n].ops) for h in grp)
             for grp in groups] for n in order]
    memory = [node_memory(g.nodes[n].param_bytes, scale * g.nodes[n].act_bytes, microbatches,
                          dtype_bytes) for n in order]
    cap = [min(capacity[h] for h in grp) for grp in groups]
    bwm = [[math.inf] * dv for _ in range(dv)]
    latm = [[0.0] * dv for _ in range(dv)]
    for d in range(dv):
        for e in range(dv):
            if d != e:
                pairs = list(zip(groups[d], groups[e], strict=True))
                bwm[d][e] = min(bw[(a, b)] for a, b in pairs)
                latm[d][e] = max(lat[(a, b)] for a, b in pairs)
    edges = {(pos[u], pos[v]): scale * b for (u, v), b in g.edges.items()}
    return PlacementProblem(nodes=order, devices=["+".join(grp) for grp in groups], cost=cost,
                            memory=memory, capacity=cap, edges=edges, bandwidth=bwm,
                            latency=latm, microbatches=microbatches)
