"""A job as TAG's plain data: op-groups, the search space, the joint graph.

From a planner context (`topoctl.strategies.PlanContext`, passed in) to what the pure parts
of TAG (Zhang et al., IEEE TPDS 2023) search over: the op graph coarsened into op-groups
(`graph.coarsen`, the placement strategy's coarse graph, in a topological order, at most
`max_groups` of balanced cost), the `topoctl.tag.space.Space` of the job (what the runtime
executes) and the `topoctl.tag.features.JointGraph` the GNN prior reads. O(ops log ops +
hosts^2) besides the coarsening.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx

from topoctl.graph.coarsen import CoarseGraph, coarsen_graph, from_opgraph
from topoctl.placement.build import route_matrix
from topoctl.sim.fabric import network_from_fabric
from topoctl.sim.routing import shortest_next_hops
from topoctl.tag.features import JointGraph, joint_graph
from topoctl.tag.space import Space

if TYPE_CHECKING:  # annotations only
    from topoctl.sim.network import Network
    from topoctl.strategies import PlanContext
    from topoctl.tag.kit import Kit


@dataclass
class Group:
    """An op-group: its fx ops in graph order, forward + backward seconds (reference host),
    parameter and kept-activation bytes, its SFB-eligible layers (op names)."""

    ops: list[str]
    cost: float
    param_bytes: int
    act_bytes: int
    linear: list[str] = field(default_factory=list)


def coarse_graph(ctx: PlanContext) -> CoarseGraph:
    """The placement strategy's coarse graph of the job (edges priced on the slowest link)."""
    fine = from_opgraph(ctx.graph, ctx.host_costs(ctx.hosts[0]))
    hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
    bw, _ = route_matrix(network_from_fabric(ctx.fabric, hops), ctx.hosts)
    coarse, _ = coarsen_graph(fine, min(bw.values(), default=1e9))
    return coarse


def op_groups(ctx: PlanContext, max_groups: int, kit: Kit) -> list[Group]:
    """The coarse graph's nodes in a topological order (ties: first fx op), adjacent ones
    merged into at most `max_groups` of balanced cost (stages are contiguous in this order, so
    merging neighbours only removes stage boundaries)."""
    cg = coarse_graph(ctx)
    pos = {o.name: i for i, o in enumerate(ctx.graph.ops)}
    dg = nx.DiGraph()
    dg.add_nodes_from(cg.nodes)
    dg.add_edges_from(cg.edges)
    first = {n: min(pos[o] for o in cg.nodes[n].ops) for n in cg.nodes}
    order = list(nx.lexicographical_topological_sort(dg, key=first.__getitem__))
    chunks = balanced([cg.nodes[n].cost for n in order], max_groups)
    lin = {op.name for op, *_ in kit.linear_layers(ctx.graph)}
    out = []
    for a, b in chunks:
        nodes = [cg.nodes[n] for n in order[a:b]]
        ops = sorted((o for n in nodes for o in n.ops), key=pos.__getitem__)
        out.append(Group(ops, sum(n.cost for n in nodes), sum(n.param_bytes for n in nodes),
                         sum(n.act_bytes for n in nodes), [o for o in ops if o in lin]))
    return out


def balanced(costs: list[float], k: int) -> list[tuple[int, int]]:
    """At most `k` contiguous chunks [a, b) of `costs`, cut where the running sum crosses each
    multiple of total / k (each item alone when there are at most k). O(len(costs))."""
    if len(costs) <= k:
        return [(i, i + 1) for i in range(len(costs))]
    total = sum(costs) or 1.0
    cuts, run = [0], 0.0
    for i, c in enumerate(costs[:-1]):
        run += c
        left = len(costs) - 1 - i  # items after i
        if (run >= total * len(cuts) / k or left <= k - len(cuts)) and len(cuts) < k:
            cuts.append(i + 1)
    return list(zip(cuts, cuts[1:] + [len(costs)], strict=True))


def group_times(ctx: PlanContext, groups: list[Group], speeds: dict[str, float]
                ) -> list[list[float]]:
    """Seconds of each group on each host (`ctx.hosts` order) at the host's speed."""
    return [[sum(ctx.host_costs(h)[o].fwd + ctx.host_costs(h)[o].bwd for o in g.ops)
             / speeds.get(h, 1.0) for h in ctx.hosts] for g in groups]


def build_space(ctx: PlanContext, groups: list[Group], dp_kinds: tuple[str, ...], kit: Kit,
                widen: bool = True, times: list[list[float]] | None = None) -> Space:
    """The job's search space (`topoctl.tag.space`): replica counts the batch splits into,
    data-parallel kinds that plan, SFB groups (one rank per host), hosts fastest first.
    `widen`: what the runtime runs beyond equal replica counts: any replica count up to a
    micro-batch's rows at every stage, packed trees as a stage's sync (direct fabrics: a
    stage's trees use its own cables) and batch shares by speed inside a stage (offered where
    the hosts' seconds for the whole model, `times`: group x host, differ)."""
    hosts = tuple(ctx.hosts)
    micro = ctx.job.parallelism.microbatches
    one_rank = ctx.world_size == len(hosts)
    rows = ctx.job.batch.global_ // micro if ctx.job.batch.global_ % micro == 0 else 0
    sizes = tuple(g for g in range(1, len(hosts) + 1) if one_rank and (
        g <= rows if widen else ctx.job.batch.global_ % (g * micro) == 0))
    sfb = frozenset(i for i, g in enumerate(groups) if g.linear) if one_rank else frozenset()
    # fastest first: by the whole model's seconds on each host (its device type and `speed`;
    # `hosts[].speed` alone ranked a V100 before an H100 on mixed GPUs), else by `speed`
    speed = {h: (-sum(row[j] for row in times) if times else kit.host_speed(ctx, h))
             for j, h in enumerate(hosts)}
    order = tuple(sorted(hosts, key=lambda h: (-speed[h], hosts.index(h))))
    if not widen:
        return Space(hosts, len(groups), sizes, dp_kinds, sfb, order=order)
    return Space(hosts, len(groups), sizes, dp_kinds, sfb, order=order, equal_replicas=False,
                 stage_syncs=("ring", "trees", "ps") if ctx.fabric.kind == "direct"
                 else ("ring", "ps"), speeds=tuple(
                     float(f"{1.0 / max(sum(row[j] for row in times), 1e-12):.6g}")
                     for j in range(len(hosts))) if times else ())


def joint_graph_of(ctx: PlanContext, groups: list[Group], times: list[list[float]],
                   network: Network, memory: dict[str, int]) -> JointGraph:
    """The job's joint graph (`topoctl.tag.features`): each group's `times` on each host,
    bytes between groups, route bandwidths on `network`, the hosts' `memory`."""
    hosts = list(ctx.hosts)
    where = {o: i for i, g in enumerate(groups) for o in g.ops}
    ops = ctx.graph.by_name()
    flow: dict[tuple[int, int], float] = {}
    for o in ctx.graph.ops:
        for i in o.inputs:
            if i in where and where[i] != where[o.name]:
                k = (where[i], where[o.name])
                flow[k] = flow.get(k, 0.0) + ops[i].out_bytes
    bw, _ = route_matrix(network, hosts)
    pos = {h: i for i, h in enumerate(hosts)}
    return joint_graph(times, [g.param_bytes for g in groups], [g.act_bytes for g in groups],
                       [bool(g.linear) for g in groups], flow,
                       {(pos[a], pos[b]): v for (a, b), v in bw.items()},
                       [memory[h] for h in hosts])
