"""Post-pass ``+shares``: batch shares by speed on any data-parallel strategy (HAP's DP-CP).

HAP (Zhang et al., EuroSys'24, "HAP: SPMD DNN training on heterogeneous GPU clusters with
automated program synthesis") compares against data parallelism whose per-device batch is
proportional to the device's speed: the simplest strong baseline on hosts that differ in
compute. Every rank takes a share of the global batch proportional to its host's speed
(`host_speed`: `hosts[].speed` times its device type's roofline speed, or its timing on this
CPU, over the slowest type's; integer sample counts summing to the global batch,
`topoctl.apportion.apportion`), and weights its loss by ``world * share / global`` so that
the average the AllReduce forms equals the gradient of one process on the whole batch
(`topotrain.shares` does it in the ranks).

The simulator's iteration is the base strategy's with each host's forward and backward scaled
by ``share / per_rank`` (compute linear in the batch: the same op costs, timed at the even
per-rank batch); the planner runs every strategy's tasks at its hosts' speeds
(`strategies.host_speeds`, `Network.speed`), so a host `speed` times as fast takes 1/speed of that
time; the gradients, hence the AllReduce, do not change. The shares go into the plan's
``job.batch.shares`` (the renderer moves them there from ``collective.shares``) and its
``metadata.collective.shares``.

Declared as the post-pass ``shares`` (`strategies.post_pass`): ``baseline+shares`` (alias
``shares``) and ``trees+shares``, right after the base; `with_shares(ctx, strategy)` applies it
to any other data-parallel strategy (one whose hosts' compute tasks are
`baseline.dp_tasks`'s ``fwd@h`` and ``bwd<k>@h``). O(ranks log ranks + tasks).
"""

from __future__ import annotations

import re
from dataclasses import replace

from topoctl.apportion import apportion
from topoctl.sim.tasks import Compute, Task

from . import PlanContext, Strategy, StrategyError, post_pass

_SAMPLE_TASK = re.compile(r"^(fwd|bwd\d+)@(.+)$")  # dp_tasks' per-sample compute of a host


def host_speed(ctx: PlanContext, host: str) -> float:
    """`host`'s relative compute speed: its `hosts[].speed` (1 when not given) times how much
    faster its device type runs a rank's forward and backward than the slowest type among
    the training hosts (the device table's roofline, or this CPU's timing: `ctx.costs`).
    Hosts of one device type: their `hosts[].speed`, as before."""
    def work(h: str) -> float:
        return sum(x.fwd + x.bwd for x in ctx.host_costs(h).values())

    slowest = max(work(h) for h in ctx.hosts)
    w = work(host)
    ratio = slowest / w if w > 0 and slowest > 0 else 1.0
    return (ctx.cluster.host(host).speed or 1.0) * ratio


def rank_shares(ctx: PlanContext) -> list[int]:
    """Samples per iteration of every global rank, proportional to its host's speed."""
    speeds = [0.0] * ctx.world_size
    for h, rs in ctx.ranks.items():
        sp = host_speed(ctx, h)
        for r in rs:
            speeds[r] = sp
    return apportion(ctx.job.batch.global_, speeds)


def scaled_tasks(tasks: list[Task], factor: dict[str, float]) -> list[Task]:
    """`tasks` with each host's per-sample compute (``fwd@h``, ``bwd<k>@h``) times
    ``factor[h]``; everything else (the optimiser step, the collectives) as it was."""
    out: list[Task] = []
    for t in tasks:
        m = _SAMPLE_TASK.match(t.id) if isinstance(t, Compute) else None
        if m and m.group(2) in factor:
            t = replace(t, duration=t.duration * factor[m.group(2)])
        out.append(t)
    return out


@post_pass("shares", applies_to=("baseline", "trees"))
def with_shares(ctx: PlanContext, base: Strategy) -> Strategy:
    """`base` with the global batch shared by speed: its hosts' compute rescaled, the shares
    in its collective (rendered into ``job.batch.shares``) and its notes."""
    if base.collective.get("algorithm") == "pipeline":
        raise StrategyError("batch shares need a data-parallel strategy, not a pipeline")
    if ctx.job.batch.global_ < ctx.world_size:
        raise StrategyError(f"batch.global {ctx.job.batch.global_} is below the "
                            f"{ctx.world_size} ranks: no share for some")
    shares = rank_shares(ctx)
    # a host's compute is its slowest rank's: its largest share; the host's speed is applied
    # once, by the planner's simulation of every strategy (`strategies.host_speeds`)
    factor = {h: max(shares[r] for r in rs) / ctx.local_batch for h, rs in ctx.ranks.items()}
    notes = dict(base.notes) | {"shares": {
        "speeds": {h: host_speed(ctx, h) for h in ctx.hosts},
        "samples": {h: [shares[r] for r in ctx.ranks[h]] for h in ctx.hosts}}}
    return replace(base, name=f"{base.name}+shares", tasks=scaled_tasks(base.tasks, factor),
                   collective=base.collective | {"shares": shares}, notes=notes)
