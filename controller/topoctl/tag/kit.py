"""What TAG takes from the other strategies, handed in by whoever runs it.

TAG starts from the other strategies' plans (its seeds: the ring, packed trees, TopoOpt, batch
shares, SFB's 0/1 program, the placement search's pipeline) and emits a plan in their shapes
(a data-parallel Strategy, or a pipeline built on the GPipe iteration model). This package
never imports the planner or the strategies registry (tests/unit/test_imports.py): the
registration of the ``tag`` strategy (`topoctl.strategies.tag.kit`) fills a `Kit` with those
functions and passes it in, and so does `topoctl tag train` (the CLI).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only
    from topoctl.strategies import PlanContext, Strategy


class PipelineModel(Protocol):
    """The GPipe iteration model TAG values and emits pipelines with (today the functions of
    `topoctl.strategies.placement`; any module with these names fits)."""

    pipeline_tasks: Callable[..., Any]  # (ctx, stages, groups, micro, scale, measured, ...)
    lab_network: Callable[..., Any]  # (network, hosts, measured, mtu) -> Network
    measured_stage_costs: Callable[..., Any]  # (ctx, micro_batch) -> Measured | None
    grad_bytes: Callable[..., Any]  # (ctx, stages) -> gradient bytes per stage
    trees_cpu_model: Callable[..., Any]  # (ctx, measured) -> (costs, lab) for stage trees
    cut_bytes: Callable[..., Any]  # (ctx, stage_of, nstages, scale) -> bytes per cut
    even_shares: Callable[..., Any]  # (rows, replicas) -> rows per replica


@dataclass(frozen=True)
class Kit:
    """The other strategies' functions TAG composes (module docstring).

    `plans`: the data-parallel strategies TAG's kinds start from, by kind (``ring``,
    ``trees``, ``topoopt``); `with_shares`: the ``+shares`` post-pass; `host_speed`: a
    host's speed for shares; `host_speeds`: the simulator's host speeds; `linear_layers`,
    `sfb_tasks`, `with_sfb`: SFB's candidates, tasks and post-pass; `placement`: the
    placement strategy's pipeline; `pipeline`: the GPipe iteration model; `strategy`: the
    Strategy class; `error`: the exception meaning "this strategy cannot plan this job"."""

    plans: Mapping[str, Callable[[PlanContext], Strategy]]
    with_shares: Callable[[PlanContext, Strategy], Strategy]
    host_speed: Callable[[PlanContext, str], float]
    host_speeds: Callable[[PlanContext], dict[str, float]]
    linear_layers: Callable[..., list]
    sfb_tasks: Callable[..., tuple]
    with_sfb: Callable[..., Strategy]
    placement: Callable[[PlanContext], Strategy]
    pipeline: PipelineModel
    strategy: type
    error: type[Exception]
