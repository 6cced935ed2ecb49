"""Post-pass ``+shares``: batch shares by speed on any data-parallel strategy (HAP's DP-CP).

HAP (Zhang et al., EuroSys'24, "HAP: SPMD DNN training on heterogeneous GPU clusters with
automated program synthesis") compares against data parallelism whose per-device batch is
proportional to the device's speed: the simplest strong baseline on hosts that differ in
compute. Every rank takes a share of the global batch proportional to its host's speed
(`host_speed`: `hosts[].speed` times its device type's roofline speed, or its timing on this
CPU, over the slowest type's; integer sample counts summing to the global batch,
`batch_shares`), and weights
its loss by ``world * share / global`` so that the average the AllReduce forms equals the
gradient of one process on the whole batch (`topotrain.shares` does it in the ranks).

The simulator's iteration is the base strategy's with each host's forward and backward scaled
by ``share / per_rank`` (compute linear in the batch: the same op costs, timed at the even
per-rank batch); the planner runs every strategy's tasks at its hosts' speeds
(`strategies.host_speeds`, `Network.speed`), so a host `speed` times as fast takes 1/speed of that
time; the gradients, hence the AllReduce, do not change. The shares go into the plan's
``job.batch.shares`` (the renderer moves them there from ``collective.shares``) and its
``metadata.collective.shares``.

Registered as ``baseline+shares`` (alias ``shares``) and ``trees+shares``; `with_shares(ctx,
strategy)` applies it to any other data-parallel strategy (one whose hosts' compute tasks are
`baseline.dp_tasks`'s ``fwd@h`` and ``bwd<k>@h``). O(ranks log ranks + tasks).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction

from topoctl.sim.tasks import Compute, Task

from . import PlanContext, Strategy, StrategyError
from . import baseline as _baseline
from . import trees as _trees

_SAMPLE_TASK = re.compile(r"^(fwd|bwd\d+)@(.+)$")  # dp_tasks' per-sample compute of a host


def batch_shares(total: int, speeds: Sequence[float]) -> list[int]:
    """`total` samples split over ranks in proportion to `speeds`: integers summing to
    `total`, each at least 1 (largest-remainder apportionment, Hamilton's method, in exact
    rational arithmetic; ties go to the lower rank, so the result is deterministic). Every
    share is within one sample of its exact quota ``total * speed / sum(speeds)`` (the bound
    of the method) before the at-least-one rule. ValueError when `total` < ranks or a speed
    is not positive. O(n log n)."""
    if not speeds or any(s <= 0 for s in speeds):
        raise ValueError("speeds must be positive, one per rank")
    if total < len(speeds):
        raise ValueError(f"{total} samples cannot give each of {len(speeds)} ranks one")
    exact = [Fraction(s) for s in speeds]
    whole = sum(exact)
    quota = [total * s / whole for s in exact]
    out = [int(q) for q in quota]  # floors (quotas are positive)
    order = sorted(range(len(quota)), key=lambda r: (-(quota[r] - out[r]), r))
    for r in order[: total - sum(out)]:
        out[r] += 1
    for r in range(len(out)):  # a very slow rank still takes one sample: from the largest
        if out[r] == 0:
            big = max(range(len(out)), key=lambda i: (out[i], -i))
            out[big] -= 1
            out[r] = 1
    return out


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
    return batch_shares(ctx.job.batch.global_, speeds)


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


def baseline_shares(ctx: PlanContext) -> Strategy:
    """The baseline strategy with batch shares by speed."""
    return with_shares(ctx, _baseline.plan(ctx))


def trees_shares(ctx: PlanContext) -> Strategy:
    """The trees strategy with batch shares by speed."""
    return with_shares(ctx, _trees.plan(ctx))


PLANNER_STRATEGIES = {"shares": baseline_shares, "baseline+shares": baseline_shares,
                      "trees+shares": trees_shares}
