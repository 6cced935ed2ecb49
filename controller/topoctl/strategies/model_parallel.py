"""Data-parallel iterations with model-parallel ops on owner hosts (DLRM-style: embedding
tables), for the simulator (used by the ``topoopt`` strategy). Not the pipeline's "hybrid"
(replicated pipeline stages, `strategies.placement`).

A *model-parallel group* is one parameterised op (in TopoOpt's DLRM: an embedding table) that
lives on one owner host instead of being replicated: the owner computes it for the whole global
batch and exchanges activations with every other host (forward: owner -> host, the op's output
for that host's samples; backward: host -> owner, the gradient of that output), an all-to-all
pattern when owners are spread. Its parameters leave the gradient AllReduce. Everything else
stays data parallel (``baseline.dp_tasks``).

Simplification (stated in docs/topoopt.md): the exchanged ops are assumed to sit at the start of
the forward pass (embeddings, input towers), so every host's forward waits for its activations
and its gradients leave after its backward pass; the owner's optimizer step waits for them.
O(ops + hosts * (buckets + groups)) tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from topoctl.graph.cost import OpCost
from topoctl.graph.ops import OpGraph
from topoctl.sim.schedules import CollectiveAlgorithm
from topoctl.sim.tasks import Compute, Task, Transfer
from topoctl.strategies import PlanContext
from topoctl.strategies.baseline import backward_task, dp_tasks

MAX_GROUPS = 16  # model-parallel candidates: the largest parameterised ops


def mp_candidates(graph: OpGraph, limit: int = MAX_GROUPS) -> list[str]:
    """The parameterised ops worth moving: largest parameters first (ties: graph order)."""
    ops = [(o.param_bytes, i, o.name) for i, o in enumerate(graph.ops) if o.param_bytes > 0]
    return [name for _, _, name in sorted(ops, key=lambda x: (-x[0], x[1]))[:limit]]


def owners(hosts: list[str], groups: list[str]) -> dict[str, str]:
    """Round-robin owners in candidate order (the largest groups on distinct hosts)."""
    return {g: hosts[i % len(hosts)] for i, g in enumerate(groups)}


def model_parallel_tasks(ctx: PlanContext, mp: Mapping[str, str], order: list[str],
                 algorithm: CollectiveAlgorithm) -> tuple[list[Task], list[int],
                                                          dict[tuple[str, str], float]]:
    """Tasks of one iteration with the ops in `mp` (op -> owner) model parallel. Returns
    (tasks, gradient bucket sizes, model-parallel traffic (src, dst) -> bytes)."""
    if not mp:
        tasks, sizes = dp_tasks(ctx, order, algorithm)
        return tasks, sizes, {}
    ops = ctx.graph.by_name()
    g2 = OpGraph(ctx.graph.model, ctx.graph.batch, ctx.graph.dtype_bytes,
                 [replace(o, param_bytes=0, params=()) if o.name in mp else o
                  for o in ctx.graph.ops])
    zero = OpCost(0.0, 0.0)
    costs2 = {dev: {k: (zero if k in mp else c) for k, c in table.items()}
              for dev, table in ctx.costs.items()}
    ctx2 = replace(ctx, graph=g2, costs=costs2)
    tasks, sizes = dp_tasks(ctx2, order, algorithm)
    world = ctx.world_size
    nb = len(sizes)
    pre: list[Task] = []
    post: list[Task] = []
    traffic: dict[tuple[str, str], float] = {}
    fwd_deps: dict[str, list[str]] = {h: [] for h in ctx.hosts}
    step_deps: dict[str, list[str]] = {h: [] for h in ctx.hosts}
    for k, (op, owner) in enumerate(sorted(mp.items())):
        c = ctx.host_costs(owner)[op]
        pre.append(Compute(f"mpf{k}@{owner}", owner, world * c.fwd))
        fwd_deps[owner].append(f"mpf{k}@{owner}")
        back = []
        for h in ctx.hosts:
            if h == owner:
                continue
            size = float(ops[op].out_bytes * len(ctx.ranks[h]))
            pre.append(Transfer(f"mpx{k}>{h}", owner, h, size, (f"mpf{k}@{owner}",)))
            fwd_deps[h].append(f"mpx{k}>{h}")
            post.append(Transfer(f"mpg{k}<{h}", h, owner, size, (backward_task(nb, h),)))
            back.append(f"mpg{k}<{h}")
            traffic[(owner, h)] = traffic.get((owner, h), 0.0) + size
            traffic[(h, owner)] = traffic.get((h, owner), 0.0) + size
        post.append(Compute(f"mpb{k}@{owner}", owner, world * c.bwd,
                            tuple(back) + (backward_task(nb, owner),)))
        step_deps[owner].append(f"mpb{k}@{owner}")
    out: list[Task] = []
    for t in tasks:
        if isinstance(t, Compute) and t.id.startswith("fwd@"):
            t = replace(t, deps=t.deps + tuple(fwd_deps[t.device]))
        elif isinstance(t, Compute) and t.id.startswith("step@"):
            t = replace(t, deps=t.deps + tuple(step_deps[t.device]))
        out.append(t)
    return pre + out + post, sizes, traffic
