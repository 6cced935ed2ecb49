"""TAG's seeds: the other strategies' plans the search starts from and never falls below.

The ring (the baseline every value is relative to), batch shares by speed, the `placement`
strategy's pipeline, SFB's 0/1 program's choice of layers, packed trees (with its fusion
search), TopoOpt: each planned through the `Kit` and valued on the evaluator (cached), cheap
ones first. Under a counted budget (the default) each runs to completion; with the job's
`tag.time_limit` one still running at the deadline is abandoned and recorded (`Budget.seed`).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from topoagent.protocol import TopoError
from topoctl.tag.budget import Budget, OutOfTime, call_until
from topoctl.tag.evaluator import Evaluator
from topoctl.tag.problem import Group
from topoctl.tag.space import DP_KINDS, Plan

if TYPE_CHECKING:  # annotations only
    from topoctl.strategies import PlanContext, Strategy


def valued(ev: Evaluator, kind: str) -> float:
    """`kind` planned and its data-parallel plan simulated (both cached in `ev`)."""
    ev.dp_strategy(kind)
    return ev.time(Plan("dp", kind))


def _skip(ctx: PlanContext, kind: str, kinds: list[str], differ: bool) -> bool:
    """Whether `kind` is not offered: a ``+shares`` kind when the hosts' speeds are equal
    (the same plan) or its base kind does not plan; ``topoopt`` off direct-connect fabrics."""
    base = kind.removesuffix("+shares")
    return (kind != base and (not differ or base not in kinds)) or (
        kind == "topoopt" and ctx.fabric.kind != "direct")


def _trees_fusion(ev: Evaluator, budget: Budget) -> None:
    """Under a wall clock: `trees` with its fusion search in half of what is left of the
    seeds' share; if that runs out, `trees` is planned again later with the job's bucket cap
    alone (`Evaluator.fixed_fusion`). Counted budgets plan it once, in `dp_kinds`."""
    end = budget.seeds_end()
    if end is None:
        return
    t0 = time.perf_counter()
    try:
        call_until(lambda: valued(ev, "trees"), t0 + (end - t0) / 2)
    except OutOfTime:
        if not ev.planned("trees"):  # still planning: plan it again, cheaper
            ev.fixed_fusion = True
            budget.note_cut("seed trees fusion search")
    print(f"tag: seed trees with its fusion search: {time.perf_counter() - t0:.1f} s"
          + ("" if ev.planned("trees") else " (out of time)"), file=sys.stderr, flush=True)


def dp_kinds(ctx: PlanContext, ev: Evaluator, budget: Budget,
             cands: tuple[str, ...] = DP_KINDS, have: tuple[str, ...] = ()
             ) -> tuple[str, ...]:
    """The data-parallel kinds of `cands` that plan this job (none without
    `parallelism.data`), added to `have`; the ``+shares`` kinds only when the hosts' speeds
    differ (otherwise the same plan) and their base kind plans; the ``topoopt`` strategy's
    whole plan on direct-connect fabrics. Each kind is planned and simulated (its anchor's
    value, cached) as a seed of the `budget` (the ring, the baseline every value is relative
    to, always to completion)."""
    if not ctx.job.parallelism.data:
        return ()
    differ = len({ev.kit.host_speed(ctx, h) for h in ctx.hosts}) > 1
    kinds = list(have)
    for k in cands:
        if _skip(ctx, k, kinds, differ):
            continue
        if k == "trees":
            _trees_fusion(ev, budget)
        if k != "ring" and budget.seed(k, lambda k=k: valued(ev, k)) is None:
            continue
        if ev.dp_strategy(k) is not None:
            kinds.append(k)
    return tuple(k for k in DP_KINDS if k in kinds)


def sfb_choice(ctx: PlanContext, ev: Evaluator, groups: list[Group]) -> frozenset[str]:
    """The layers the `+sfb` post-pass's 0/1 program picks on the ring plan (none when SFB is
    not in the space: no fully connected layer, or several ranks per host)."""
    base = ev.dp_strategy("ring") if ctx.job.parallelism.data else None
    if not any(g.linear for g in groups) or ctx.world_size != len(ctx.hosts) or base is None:
        return frozenset()
    try:
        layers = ev.kit.with_sfb(ctx, base).notes["sfb"]["layers"]
    except TopoError:  # StrategyError: SFB does not plan here
        return frozenset()
    return frozenset(v["op"] for v in layers.values())


def placement_seed(ctx: PlanContext, ev: Evaluator) -> tuple[Strategy, float] | None:
    """The `placement` strategy's pipeline and its simulated time (None when it cannot plan
    the job)."""
    try:
        p = ev.kit.placement(ctx)
    except TopoError:  # StrategyError, PlacementError
        return None
    return p, ev.simulate(p)
