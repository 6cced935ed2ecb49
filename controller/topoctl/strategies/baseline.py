"""Baseline: data parallel across all hosts, ring AllReduce in host order, shortest-path routing
on the given fabric: what a user gets today from NCCL/gloo defaults.

`dp_tasks` builds the simulator's task DAG for one data-parallel iteration with DDP-style
gradient buckets (Li et al., VLDB'20, PyTorch DDP): buckets fill in backward order up to
`sync.bucket` bytes; bucket k all-reduces as soon as every host has produced it, overlapping the
rest of the backward pass (`bucket_allreduces`: a ring's AllReduces queue on the process
group's one connection per peer, other algorithms run one bucket after another). Other
data-parallel strategies reuse it with another order or collective algorithm. O(ops + hosts *
buckets) tasks, plus the collective schedules.
"""

from __future__ import annotations

from collections.abc import Sequence

from topoctl.collective.hierarchical import ring_shards
from topoctl.graph.ops import OpGraph
from topoctl.sim.fabric import network_from_fabric
from topoctl.sim.routing import shortest_next_hops
from topoctl.sim.schedules import ALGORITHMS, CollectiveAlgorithm, ring_allreduce
from topoctl.sim.tasks import Collective, Compute, Task
from topoctl.strategies import PlanContext, Strategy
from topoctl.strategies.devices import (
    device_groups,
    device_network,
    hierarchical_algorithm,
    hierarchical_collective,
    local_size,
    multi_rank,
)


def buckets(graph: OpGraph, cap: int) -> list[tuple[list[str], int]]:
    """Gradient buckets: ([ops whose gradients it holds, in backward order], bytes). A bucket
    closes once it holds >= cap bytes (DDP's rule)."""
    out: list[tuple[list[str], int]] = []
    ops: list[str] = []
    size = 0
    for op, _param, b in graph.gradient_order():
        if not ops or ops[-1] != op:
            ops.append(op)
        size += b
        if size >= cap:
            out.append((ops, size))
            ops, size = [], 0
    if ops:
        out.append((ops, size))
    return out


def backward_chunks(graph: OpGraph, costs: dict, bucket_ops: list[list[str]]) -> list[float]:
    """Backward time up to and including each bucket's last op, then the tail (len + 1)."""
    ends = {ops[-1]: i for i, ops in enumerate(bucket_ops)}
    chunks = [0.0] * (len(bucket_ops) + 1)
    k = 0
    for op in reversed(graph.ops):
        chunks[k] += costs[op.name].bwd
        if op.name in ends:
            k = ends[op.name] + 1
    return chunks


def step_time(ctx: PlanContext, host: str) -> float:
    """Optimizer step: read weights, gradients and one moment, write weights (memory bound);
    on lab hosts the step as timed on this CPU."""
    if ctx.step_s is not None:  # timed on this CPU (lab hosts), cost.scale applied
        return ctx.step_s
    d = ctx.device[host]
    return ctx.job.cost.scale * (d.launch + 4 * ctx.graph.param_bytes / (d.mem_bw * d.efficiency))


def backward_task(k: int, host: str) -> str:
    """Id of `host`'s backward chunk `k` in :func:`dp_tasks` (chunk ``len(buckets)``: the
    backward's tail, after the last bucket's ops: the backward is done when it is)."""
    return f"bwd{k}@{host}"


# the process group gloo's ring AllReduces run in (DDP's, the bucket runtime's: the default one)
GLOO_GROUP = "world"


def bucket_allreduces(order: Sequence[str], algorithm: CollectiveAlgorithm,
                      sizes: Sequence[float], ready: Sequence[tuple[str, ...]]
                      ) -> list[Collective]:
    """The AllReduce ``ar<k>`` of each bucket (`sizes[k]` bytes over `order`), issued once the
    tasks `ready[k]` are done. The ring runs as gloo's asynchronous AllReduces of one process
    group (DDP's buckets, `topotrain.buckets` with backward overlap): issued as soon as ready,
    they queue on the group's one connection per peer in issue order (`GLOO_GROUP`,
    `sim.connections`), so a bucket's bytes wait for the buckets issued before it without
    sharing the wire with them. Other algorithms (the tree runtime's one thread per DDP hook)
    run bucket k after bucket k-1. O(buckets)."""
    out: list[Collective] = []
    ring = algorithm is ring_allreduce
    for k, size in enumerate(sizes):
        chain = (f"ar{k - 1}",) if k and not ring else ()
        out.append(Collective(f"ar{k}", algorithm(list(order), float(size)),
                              tuple(ready[k]) + chain, group=GLOO_GROUP if ring else None))
    return out


def dp_tasks(ctx: PlanContext, order: Sequence[str], algorithm: CollectiveAlgorithm,
             bucket_cap: int | None = None) -> tuple[list[Task], list[int]]:
    """One data-parallel iteration: per host forward, backward in bucket chunks, optimizer step;
    one collective per bucket over `order`. Returns (tasks, bucket sizes)."""
    cap = bucket_cap or ctx.job.sync.bucket
    bks = buckets(ctx.graph, cap)
    tasks: list[Task] = []
    for h in ctx.hosts:
        c = ctx.host_costs(h)
        tasks.append(Compute(f"fwd@{h}", h, sum(x.fwd for x in c.values())))
        chunks = backward_chunks(ctx.graph, c, [ops for ops, _ in bks])
        prev = f"fwd@{h}"
        for k, t in enumerate(chunks):
            tid = backward_task(k, h)
            tasks.append(Compute(tid, h, t, (prev,)))
            prev = tid
    tasks += bucket_allreduces(order, algorithm, [s for _, s in bks],
                               [tuple(backward_task(k, h) for h in ctx.hosts)
                                for k in range(len(bks))])
    every = tuple(f"ar{k}" for k in range(len(bks)))
    for h in ctx.hosts:
        tasks.append(Compute(f"step@{h}", h, step_time(ctx, h),
                             (backward_task(len(bks), h),) + every))
    return tasks, [s for _, s in bks]


def ring_collective(ctx: PlanContext, order: Sequence[str]
                    ) -> tuple[CollectiveAlgorithm, list[str], dict]:
    """(algorithm, members, plan collective) of a ring AllReduce over the hosts in `order`.
    One rank per host: gloo's ring over the hosts. Hosts of k > 1 ranks each: the
    hierarchical AllReduce with a ring per shard in host `order` (`strategies.devices`), and
    `hierarchical: {local_size: k}` in the plan. Hosts of different counts: one flat ring
    over every rank in rank order, as the runtime runs it."""
    coll = {"algorithm": "ring", "order": list(order)}
    if not multi_rank(ctx):
        return ALGORITHMS["ring"], list(order), coll
    k = local_size(ctx)
    if k > 1:
        algorithm, members = hierarchical_algorithm(ctx, order, ring_shards)
        return algorithm, members, hierarchical_collective(coll, k)
    flat = [d for g in device_groups(ctx) for d in g]
    return ALGORITHMS["ring"], flat, coll


def plan(ctx: PlanContext) -> Strategy:
    """Data parallel over every host, ring AllReduce in host order (hierarchical on hosts
    with several ranks: `ring_collective`), shortest-path routing."""
    hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
    algorithm, members, coll = ring_collective(ctx, ctx.hosts)
    tasks, sizes = dp_tasks(ctx, members, algorithm)
    network = network_from_fabric(ctx.fabric, hops, cpu_pool=ctx.cpu_pool)
    return Strategy(name="baseline", fabric=ctx.fabric, hops=hops,
                    network=device_network(ctx, network),
                    tasks=tasks, collective=coll, buckets=sizes)


PLANNER_STRATEGIES = {"baseline": plan}
