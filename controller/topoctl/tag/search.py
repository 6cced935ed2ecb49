"""TAG's search driver: seeds, the space, anchors, the tree (PUCT) and the walk, on one budget.

TAG (Zhang et al., "Expediting Distributed DNN Training with Device Topology-Aware Graph
Deployment", IEEE TPDS 2023). The op graph is coarsened into op-groups (`problem.op_groups`);
`topoctl.tag.space` says what may be decided per group (data parallelism with ring/trees,
batch shares, SFB per group; or pipeline stages each on a replica set of any size with ring /
packed trees / parameter server / none and even or by-speed row shares), restricted to what
`topoctl run` executes; `topoctl.tag.mcts` searches it with PUCT, every node valued by
simulating its default completion and its `lookahead` completions (`evaluator.Evaluator`).

Anchors valued before the search: every data-parallel kind, the ring with SFB's choice, the
balanced pipeline over all hosts and the whole model on the fastest host, so the result is
never slower than those; after the tree, FlexFlow's walk (`walk`) and the better of the two.

Budget (`budget.Budget`): counted by default (seeds to completion, `playouts` playouts and as
many walk steps, at most `simulations` distinct plans simulated by the two: the same input
gives the same plan on any machine and load); a wall clock
only when the job sets `tag.time_limit`, and the plan then says what it cut.
Cost: one simulation per distinct plan valued, O(playouts * (depth * branching + lookahead *
simulation)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from topoctl.tag import mcts
from topoctl.tag.budget import TREE_SHARE, Budget
from topoctl.tag.evaluator import Evaluator, final_reserve, reward
from topoctl.tag.features import JointGraph
from topoctl.tag.lookahead import lookahead
from topoctl.tag.problem import Group, balanced, build_space, joint_graph_of, op_groups
from topoctl.tag.seeds import dp_kinds, placement_seed, sfb_choice
from topoctl.tag.space import Space, State, complete, legal, plan_of
from topoctl.tag.walk import walk

if TYPE_CHECKING:  # annotations only
    from topoctl.strategies import PlanContext, Strategy
    from topoctl.tag.kit import Kit


@dataclass
class Outcome:
    """What a TAG search found: the best complete state, its time, the baseline's, the search
    result, the space, the groups, the evaluator, the joint graph, the placement seed, the
    budget (what the clock cut, if one was set) and the walk's record."""

    state: State
    time: float
    base_time: float
    result: mcts.SearchResult
    space: Space
    groups: list[Group]
    evaluator: Evaluator
    graph: JointGraph
    budget: Budget
    placement: tuple[Strategy, float] | None = None  # its pipeline and time (a seed)
    walk: dict | None = None  # the MCMC walk after the tree (`topoctl.tag.walk`)

    @property
    def cut(self) -> list[str]:
        """What the wall clock cut short (empty under a counted budget)."""
        return self.budget.cut


def anchors(space: Space, groups: list[Group], sfb_ops: frozenset[str] = frozenset()
            ) -> list[State]:
    """Complete states valued before the search: each data-parallel kind, the ring with SFB on
    the groups holding a layer of `sfb_ops` (the `+sfb` post-pass's 0/1 program's choice), the
    balanced pipeline over all hosts (one stage each, host order) and the whole model on the
    fastest host."""
    out: list[State] = [complete(space, (("dp", k, False),)) for k in space.dp_kinds]
    chosen = {i for i, g in enumerate(groups) if set(g.linear) & sfb_ops} & space.sfb_groups
    if chosen and "ring" in space.dp_kinds:
        out.append(tuple([("dp", "ring", 0 in chosen)] + [
            ("sfb",) if i in chosen else ("ar",) for i in range(1, len(groups))]))
    if 1 in space.sizes:
        out.append(complete(space, (("stage", (space.order[0],), "none"),)))
        k = min(len(space.hosts), len(groups))
        cuts = {a for a, _ in balanced([g.cost for g in groups], k)}
        hs = iter(space.hosts)
        out.append(tuple(("stage", (next(hs),), "none") if i in cuts else ("same",)
                         for i in range(len(groups))))
    return out


def complete_any(space: Space, state: State) -> State:
    """`complete`, with the empty state of a space without data parallelism as one stage on
    the fastest host."""
    if not state and not space.dp_kinds:
        state = (("stage", (space.order[0],), "none"),)
    return complete(space, state)


@dataclass
class _Seeded:
    """What the seeds gave: the data-parallel kinds that plan, SFB's layers, the placement
    pipeline."""

    kinds: tuple[str, ...]
    sfb: frozenset[str] | None
    placement: tuple[Strategy, float] | None = None


def _run_seeds(ctx: PlanContext, ev: Evaluator, groups: list[Group], budget: Budget,
               use_anchors: bool, with_placement: bool) -> _Seeded:
    """The seeds, cheap ones first: the ring (the baseline), shares, placement, SFB, trees,
    topoopt (`topoctl.tag.seeds`)."""
    kinds = dp_kinds(ctx, ev, budget, ("ring", "ring+shares"))
    other = (budget.seed("placement", lambda: placement_seed(ctx, ev)) if with_placement
             else None)
    sfb = budget.seed("sfb", lambda: sfb_choice(ctx, ev, groups)) if use_anchors else None
    kinds = dp_kinds(ctx, ev, budget, ("trees", "trees+shares", "topoopt"), kinds)
    return _Seeded(kinds, sfb, other)


def _base_time(space: Space, ev: Evaluator, groups: list[Group], kinds: tuple[str, ...],
               error: type[Exception]) -> float:
    """The baseline's seconds per iteration: the ring's default completion, else (nothing
    data-parallel fits) the fastest anchor; `error` when no plan fits at all."""
    base = ev.time(plan_of(complete(space, ()))) if kinds else math.inf
    if not math.isfinite(base):
        base = min((ev.time(plan_of(s)) for s in anchors(space, groups)), default=math.inf)
    if not math.isfinite(base):
        raise error("no plan fits in the hosts' memory")
    return base


def _space(ctx: PlanContext, groups: list[Group], ev: Evaluator, kinds: tuple[str, ...],
           widen: bool) -> Space:
    """The job's space with the kinds that plan; `Kit.error` when there is nothing to
    search."""
    space = build_space(ctx, groups, kinds, ev.kit, widen, ev.times)
    if not kinds and not space.sizes:
        raise ev.kit.error("nothing to search: data parallelism is off and the ranks are "
                           "not one per host (stages need that)")
    if not kinds:  # no data parallelism: the empty state completes to one stage
        space = replace(space, dp_kinds=())
    return space


def _tree(space: Space, ev: Evaluator, base: float, budget: Budget, prior, seed: int,
          progress: mcts.Progress | None, start: list[State]) -> mcts.SearchResult:
    """The PUCT search over `space` from the anchors `start`, each node valued by the best of
    its default completion and its `lookahead` completions."""
    times = ev.times

    def value(state: State) -> tuple[float, State]:
        fulls = [complete_any(space, state)] + lookahead(space, state, times)
        return max((reward(base, ev.time(plan_of(f))), -k, f) for k, f in enumerate(fulls))[::2]

    res = mcts.search(lambda s: legal(space, s), value, budget.playouts,
                      prior or mcts.uniform, seed=seed, time_limit=budget.left(final_reserve(ev)),
                      progress=progress, start=start,
                      stop=budget.sims_stop(lambda: len(ev.cache), TREE_SHARE))
    if res.stopped_by_time:
        budget.note_cut("tree search")
    return res


def run_search(ctx: PlanContext, kit: Kit, playouts: int, seed: int = 0,
               time_limit: float | None = None, net=None, max_groups: int = 24,
               progress: mcts.Progress | None = None, use_anchors: bool = True,
               started: float | None = None, with_placement: bool = False,
               widen: bool = True, seed_share: float = 1.0,
               simulations: int | None = None) -> Outcome:
    """The search on `ctx` with the other strategies' functions in `kit` (module docstring).
    `net`: a `topoctl.tag.gnn.TagNet` for the prior, None for uniform; `use_anchors`: value
    the anchors and walk after the tree (off: to measure the prior); `time_limit`: None
    (counted, the default) or seconds for everything from `started` (default: now), seeds
    included, `seed_share` of it for the seeds; `with_placement`: the placement strategy's
    pipeline as a seed; `widen`: the space with unequal replica counts, per-stage trees and
    batch shares (docs/tag.md); `simulations`: distinct plans the tree and the walk may
    simulate together (None: no cap; `budget.Budget`)."""
    budget = Budget(playouts, simulations, time_limit, seed_share)
    if started is not None:
        budget.start = started
    groups = op_groups(ctx, max_groups, kit)
    ev = Evaluator(ctx, groups, kit)
    seeded = _run_seeds(ctx, ev, groups, budget, use_anchors, with_placement)
    space = _space(ctx, groups, ev, seeded.kinds, widen)
    jg = joint_graph_of(ctx, groups, ev.times, ev.network, ev.memory)
    prior = None
    if net is not None:
        from topoctl.tag.prior import net_prior  # lazily: torch
        prior = net_prior(net, space, jg)
    base = _base_time(space, ev, groups, seeded.kinds, kit.error)
    start = anchors(space, groups, seeded.sfb or frozenset()) if use_anchors else []
    before = len(ev.cache)
    res = _tree(space, ev, base, budget, prior, seed, progress, start)
    state, walked = res.best_state, None
    if use_anchors:
        state, walked = walk(space, ev, base, playouts, seed, budget, res,
                             len(ev.cache) - before)
    return Outcome(state, ev.time(plan_of(state)), base, res, space, groups, ev, jg, budget,
                   seeded.placement, walked)
