"""Strategy ``tag``: its registration. TAG itself lives in `topoctl.tag` (docs/tag.md).

`topoctl.tag` never imports the planner or this registry: it takes the other strategies'
functions it starts from and builds with as a `topoctl.tag.kit.Kit`, which `kit()` fills here.
"""

from __future__ import annotations

from topoctl.tag import strategy as _tag
from topoctl.tag.kit import Kit

from . import PlanContext, Strategy, StrategyError, host_speeds
from . import baseline as _baseline
from . import placement as _placement
from . import sfb as _sfb
from . import shares as _shares
from . import topoopt as _topoopt
from . import trees as _trees


def _placement_pipeline(ctx: PlanContext) -> Strategy:
    return _placement.search(ctx, ctx.job.parallelism.search, "placement")


def kit() -> Kit:
    """The other strategies' functions TAG composes (`topoctl.tag.kit`)."""
    return Kit(plans={"ring": _baseline.plan, "trees": _trees.plan, "topoopt": _topoopt.plan},
               with_shares=_shares.with_shares, host_speed=_shares.host_speed,
               host_speeds=host_speeds, linear_layers=_sfb.linear_layers,
               sfb_tasks=_sfb.sfb_tasks, with_sfb=_sfb.with_sfb,
               placement=_placement_pipeline, pipeline=_placement, strategy=Strategy,
               error=StrategyError)


def plan(ctx: PlanContext) -> Strategy:
    """Strategy ``tag``: TAG's search (`topoctl.tag.strategy.plan`) with this registry's kit."""
    return _tag.plan(ctx, kit())


PLANNER_STRATEGIES = {"tag": plan}
