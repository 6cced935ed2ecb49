"""Strategy ``tag``: TAG's tree search over each op-group's replica set and gradient sync.

TAG (Zhang et al., "Expediting Distributed DNN Training with Device Topology-Aware Graph
Deployment", IEEE TPDS 2023). The op graph is coarsened into op-groups (`graph.coarsen`, the
placement strategy's coarse graph, in a topological order, at most `TagSpec.max_groups`);
`topoctl.tag.space` says what may be decided per group (data parallelism with ring/trees,
batch shares, SFB per group; or pipeline stages each on a replica set of any size with ring /
packed trees / parameter server / none and even or by-speed row shares), restricted to what
`topoctl run` executes; `topoctl.tag.mcts` searches it with
PUCT, every node valued by simulating its default completion on the project's simulator,
exactly as the planner simulates the emitted plan (host speeds, lab cores, steady period).

Reward (the paper's, without its fourth root): r - 1, r = t_baseline / t; -1 when a
host's memory does not hold its part (4 x parameters + activations of every micro-batch in
flight, `placement.build.node_memory`). Anchors valued before the search: every data-parallel
kind, the balanced pipeline over all hosts and the whole model on the fastest host, so the
result is never slower than those; after the tree, FlexFlow's MCMC walk from the baseline
(`_walk`, the same number of steps and cached values) and the better of the two. The emitted
plan reuses the existing plan shapes: a
data-parallel plan (ring or trees, ``+shares``, ``+sfb``) or a pipeline collective with per-stage
sync (`topocontract.stages`); `metadata.collective.tag` records each group's decision (shown by
`topoctl explain`). Progress goes to stderr.

Cost: one simulation per playout (cached per distinct plan), O(playouts * (depth * branching
+ simulation)); the budget is `job.tag.playouts` (default 2000) capped by `job.tag.time_limit`
seconds (default 40) for the whole strategy: the seeds (the other strategies' plans it starts
from) run first, cheap ones first, and one still running at the end of `time_limit` is
abandoned (`Budget`, `SEED_SHARE`, `topoctl.tag.budget`); the search gets the rest, less
the room the planner's simulation of the chosen plan needs (`final_reserve`).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field, replace

import networkx as nx

from topoagent.protocol import TopoError
from topoctl.apportion import apportion
from topoctl.fabric.graph import connection_links
from topoctl.graph.coarsen import CoarseGraph, coarsen_graph, from_opgraph
from topoctl.pipeline import gpipe
from topoctl.placement.build import node_memory, route_matrix
from topoctl.placement.stagesync import stage_trees
from topoctl.sim.engine import simulate
from topoctl.sim.fabric import network_from_fabric, tcp_efficiency
from topoctl.sim.routing import shortest_next_hops
from topoctl.sim.steady import overlaps_iterations, steady_period
from topoctl.tag import mcmc, mcts
from topoctl.tag.budget import OutOfTime, call_until
from topoctl.tag.features import JointGraph, joint_graph
from topoctl.tag.space import (
    DP_KINDS,
    Plan,
    Space,
    Stage,
    State,
    complete,
    describe,
    host_sets,
    legal,
    plan_of,
    split_sync,
    used_hosts,
)

from . import PlanContext, Strategy, StrategyError, host_speeds
from . import baseline as _baseline
from . import placement as _placement
from . import sfb as _sfb
from . import shares as _shares
from . import topoopt as _topoopt
from . import trees as _trees

STEADY_ITERATIONS = 3  # as the planner: ranks leaving a collective one by one


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


def op_groups(ctx: PlanContext, max_groups: int) -> list[Group]:
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
    chunks = _balanced([cg.nodes[n].cost for n in order], max_groups)
    lin = {op.name for op, *_ in _sfb.linear_layers(ctx.graph)}
    out = []
    for a, b in chunks:
        nodes = [cg.nodes[n] for n in order[a:b]]
        ops = sorted((o for n in nodes for o in n.ops), key=pos.__getitem__)
        out.append(Group(ops, sum(n.cost for n in nodes), sum(n.param_bytes for n in nodes),
                         sum(n.act_bytes for n in nodes), [o for o in ops if o in lin]))
    return out


def _balanced(costs: list[float], k: int) -> list[tuple[int, int]]:
    """At most `k` contiguous chunks [a, b) of `costs`, cut where the running sum crosses each
    multiple of total / k (each item alone when there are at most k)."""
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


def build_space(ctx: PlanContext, groups: list[Group], dp_kinds: tuple[str, ...],
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
    speed = {h: (-sum(row[j] for row in times) if times else _shares.host_speed(ctx, h))
             for j, h in enumerate(hosts)}
    order = tuple(sorted(hosts, key=lambda h: (-speed[h], hosts.index(h))))
    if not widen:
        return Space(hosts, len(groups), sizes, dp_kinds, sfb, order=order)
    return Space(hosts, len(groups), sizes, dp_kinds, sfb, order=order, equal_replicas=False,
                 stage_syncs=("ring", "trees", "ps") if ctx.fabric.kind == "direct"
                 else ("ring", "ps"), speeds=tuple(
                     float(f"{1.0 / max(sum(row[j] for row in times), 1e-12):.6g}")
                     for j in range(len(hosts))) if times else ())


class Evaluator:
    """Simulated iteration time of a TAG plan on the context (cached per canonical plan)."""

    def __init__(self, ctx: PlanContext, groups: list[Group]):
        self.ctx, self.groups = ctx, groups
        self.hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
        self.network = network_from_fabric(ctx.fabric, self.hops)
        self.cache: dict[Plan, float] = {}
        self.seconds = 0.0  # wall clock of the slowest valuation so far
        self._dp: dict[str, Strategy | None] = {}
        self.speeds = host_speeds(ctx)
        self.memory = {h: ctx.device[h].memory for h in ctx.hosts}
        self.fixed_fusion = False  # `trees` kinds with the job's bucket cap only (`_dp_kinds`)
        self._trees: dict[tuple, dict | None] = {}  # a stage's packed trees, per hosts/bytes
        # seconds of each group on each host (ctx.hosts order) at the host's speed
        self.times = [[sum(ctx.host_costs(h)[o].fwd + ctx.host_costs(h)[o].bwd for o in g.ops)
                       / self.speeds.get(h, 1.0) for h in ctx.hosts] for g in groups]

    def dp_strategy(self, kind: str) -> Strategy | None:
        """The data-parallel strategy of `kind` (None when it cannot plan this job)."""
        if kind not in self._dp:
            base, _, shares = kind.partition("+")
            plan = {"ring": _baseline.plan, "trees": _trees.plan, "topoopt": _topoopt.plan}
            ctx = self.ctx
            if base == "trees" and self.fixed_fusion:
                sync = ctx.job.sync.model_copy(update={"fusion": "fixed"})
                ctx = replace(ctx, job=ctx.job.model_copy(update={"sync": sync}))
            try:
                s = plan[base](ctx)
                self._dp[kind] = _shares.with_shares(self.ctx, s) if shares else s
            except (StrategyError, TopoError):  # e.g. topoopt on a switched fabric
                self._dp[kind] = None
        return self._dp[kind]

    def _sim(self, s: Strategy) -> float:
        net = replace(s.network, speed=self.speeds, _cache={}) if self.speeds else s.network
        if overlaps_iterations(s.tasks):  # as `planner.evaluate`
            return steady_period(s.tasks, net, STEADY_ITERATIONS)
        return simulate(s.tasks, net, record=False).iteration_time

    def time(self, plan: Plan) -> float:
        """Seconds per iteration; inf when some host's memory does not hold its part or the
        plan cannot be built."""
        if plan not in self.cache:
            t0 = time.perf_counter()
            self.cache[plan] = self._dp_time(plan) if plan.form == "dp" else self._pp_time(plan)
            self.seconds = max(self.seconds, time.perf_counter() - t0)
        return self.cache[plan]

    def dp_plan(self, plan: Plan) -> Strategy | None:
        """The data-parallel Strategy of `plan` (SFB layers as the plan says)."""
        base = self.dp_strategy(plan.kind)
        if base is None or not plan.sfb:
            return base
        chosen = [o for i in plan.sfb for o in self.groups[i].linear]
        info = {op.name: k * (m + n) * self.ctx.graph.dtype_bytes
                for op, _, k, m, n in _sfb.linear_layers(self.ctx.graph)}
        tasks, sizes = _sfb.sfb_tasks(self.ctx, chosen, info)
        return replace(base, tasks=tasks, buckets=sizes)

    def _dp_time(self, plan: Plan) -> float:
        need = node_memory(sum(g.param_bytes for g in self.groups),
                           sum(g.act_bytes for g in self.groups), 1)
        if any(need > m for m in self.memory.values()):
            return math.inf
        s = self.dp_plan(plan)
        return math.inf if s is None else self._sim(s)

    def stage_rows(self, plan: Plan) -> list[list[int]] | None:
        """Rows of each micro-batch per replica, per stage (`topocontract.stages` shares:
        even, or by speed for a ``+shares`` sync); None for an equal-count plan (every stage
        the same replicas, evenly split: the runtime's plan without shares)."""
        rows = self.ctx.job.batch.global_ // self.ctx.job.parallelism.microbatches
        out = []
        for st in plan.stages:
            if split_sync(st.sync)[2]:  # by the stage's own compute on each member
                pos = [self.ctx.hosts.index(h) for h in st.hosts]
                work = [sum(self.times[i][j] for i in range(st.first, st.last + 1)) for j in pos]
                out.append(apportion(rows, [1.0 / max(w, 1e-12) for w in work]))
            else:
                out.append(apportion(rows, [1.0] * len(st.hosts)))
        if len({tuple(r) for r in out}) == 1 and len(set(out[0])) == 1:
            return None
        return out

    def pp_parts(self, plan: Plan):
        """(stage ops, stage host groups, syncs, micro-batches, scale, measured, shares,
        measured per rows) of `plan`: `shares` None for an equal-count plan (then `scale` that
        of a replica's micro-batch), else rows per replica and `scale` that of one row."""
        ctx = self.ctx
        pos = {o.name: i for i, o in enumerate(ctx.graph.ops)}
        stages = [sorted((o for g in self.groups[st.first: st.last + 1] for o in g.ops),
                         key=pos.__getitem__) for st in plan.stages]
        hgroups = [list(st.hosts) for st in plan.stages]
        micro = ctx.job.parallelism.microbatches
        shares = self.stage_rows(plan)
        if shares is None:
            g = len(hgroups[0])
            scale = ctx.job.batch.global_ / (g * micro) / ctx.local_batch
            meas = gpipe.measured_stage_costs(ctx, ctx.job.batch.global_ // (g * micro))
            at = None
        else:
            scale = 1.0 / ctx.local_batch
            rows = sorted({x for sh in shares for x in sh})
            at = {r: gpipe.measured_stage_costs(ctx, r) for r in rows}
            meas = None if any(m is None for m in at.values()) else at[rows[0]]
            at = at if meas else None
        syncs = [self.sync_dict(st, stages[i], meas) for i, st in enumerate(plan.stages)]
        return stages, hgroups, syncs, micro, scale, meas, shares, at

    def sync_dict(self, st: Stage, ops: list[str], meas) -> dict:
        """A stage's sync as the plan states it (`topocontract.stages`); a ``trees`` sync with
        its packed trees over the stage's own cables (`placement.stagesync.stage_trees`),
        ``{"kind": "trees"}`` without a schedule when they cannot be packed."""
        kind, server, _ = split_sync(st.sync)
        if kind == "ps":
            return {"kind": "ps", "server": server}
        if kind != "trees":
            return {"kind": kind}
        nbytes = float(gpipe.grad_bytes(self.ctx, [ops])[0])
        key = (st.hosts, nbytes, meas is None)
        if key not in self._trees:
            costs, lab = gpipe.trees_cpu_model(self.ctx, meas)
            links = [(ln.a, ln.b, ln.capacity / 8.0) for ln in connection_links(self.ctx.fabric)]
            sched = stage_trees(links, list(st.hosts), nbytes, costs, lab,
                                tcp_efficiency(self.ctx.fabric.mtu))
            self._trees[key] = None if sched is None else sched.dump()
        sched = self._trees[key]
        return {"kind": "trees"} if sched is None else {"kind": "trees", "schedule": sched}

    def _pp_time(self, plan: Plan) -> float:
        stages, hgroups, syncs, micro, scale, meas, shares, at = self.pp_parts(plan)
        if any(y["kind"] == "trees" and "schedule" not in y for y in syncs):
            return math.inf  # no trees over this stage's own cables
        for s, st in enumerate(plan.stages):
            gs = self.groups[st.first: st.last + 1]
            for j, h in enumerate(st.hosts):
                sc = scale if shares is None else scale * shares[s][j]
                need = sum(node_memory(g.param_bytes, sc * g.act_bytes, micro) for g in gs)
                if need > self.memory[h]:
                    return math.inf
        tasks, _ = gpipe.pipeline_tasks(self.ctx, stages, hgroups, micro, scale, meas,
                                             syncs, shares, at)
        net = gpipe.lab_network(self.network, list(self.ctx.hosts), meas,
                                     self.ctx.fabric.mtu)
        if self.speeds:
            net = replace(net, speed=self.speeds, _cache={})
        if overlaps_iterations(tasks):  # as `planner.evaluate`
            return steady_period(tasks, net, STEADY_ITERATIONS)
        return simulate(tasks, net, record=False).iteration_time


def reward(t_base: float, t: float) -> float:
    """The speed-up over the baseline less one, r - 1 with r = t_base / t (the paper's
    reward without its fourth root above 1: the search normalises values to the range it has
    seen, and the root would hide the differences between good plans); -1 when the plan does
    not fit (t infinite)."""
    if not math.isfinite(t) or t <= 0:
        return -1.0
    return t_base / t - 1.0


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
        cuts = {a for a, _ in _balanced([g.cost for g in groups], k)}
        hs = iter(space.hosts)
        out.append(tuple(("stage", (next(hs),), "none") if i in cuts else ("same",)
                         for i in range(len(groups))))
    return out


@dataclass
class Outcome:
    """What a TAG search found: the best complete state, its time, the baseline's, the search
    result, the space and the groups."""

    state: State
    time: float
    base_time: float
    result: mcts.SearchResult
    space: Space
    groups: list[Group]
    evaluator: Evaluator
    graph: JointGraph
    placement: tuple[Strategy, float] | None = None  # its pipeline and time (a seed)
    skipped: list[str] = field(default_factory=list)  # seeds the budget left out
    walk: dict | None = None  # the MCMC walk after the tree (`_walk`)


def joint_graph_of(ctx: PlanContext, groups: list[Group], ev: Evaluator) -> JointGraph:
    """The job's joint graph (`topoctl.tag.features`): each group's time on each host at its
    speed, bytes between groups, route bandwidths, memories."""
    hosts = list(ctx.hosts)
    times = [[sum(ctx.host_costs(h)[o].fwd + ctx.host_costs(h)[o].bwd for o in g.ops)
              / ev.speeds.get(h, 1.0) for h in hosts] for g in groups]
    where = {o: i for i, g in enumerate(groups) for o in g.ops}
    ops = ctx.graph.by_name()
    flow: dict[tuple[int, int], float] = {}
    for o in ctx.graph.ops:
        for i in o.inputs:
            if i in where and where[i] != where[o.name]:
                k = (where[i], where[o.name])
                flow[k] = flow.get(k, 0.0) + ops[i].out_bytes
    bw, _ = route_matrix(ev.network, hosts)
    pos = {h: i for i, h in enumerate(hosts)}
    return joint_graph(times, [g.param_bytes for g in groups], [g.act_bytes for g in groups],
                       [bool(g.linear) for g in groups], flow,
                       {(pos[a], pos[b]): v for (a, b), v in bw.items()},
                       [ev.memory[h] for h in hosts])


# The seeds (the other strategies' plans TAG starts from) may use the whole `time_limit`
# and are cut at its end (share 1.0): so the strategy never runs past `time_limit` (the
# planner's own simulation of the chosen plan is left room for, `final_reserve`). They are
# TAG's floor ("never slower than the best other strategy"), so they are not cut earlier: with
# them cut at half the budget, under heavy load 7 of the 48 example plans got worse
# (tworack8 x bert fell back to the ring, 516 s against topoopt's 9 s). None: no deadline for
# the seeds (then the strategy can take longer than `time_limit`).
SEED_SHARE: float | None = 1.0


@dataclass
class Budget:
    """The strategy's one time budget (`topoctl.tag.budget`): seeds may run until `seeds`,
    the search until `end` (`time.perf_counter()` readings; None: no limit). `skipped`: the
    seeds abandoned when their share ran out."""

    seeds: float | None = None
    end: float | None = None
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, time_limit: float | None, started: float | None = None,
           seed_share: float | None = SEED_SHARE) -> Budget:
        """`time_limit` seconds from `started` (default: now), `seed_share` of it for seeds
        (None: the seeds run to the end, the search gets what is left)."""
        if time_limit is None:
            return cls()
        t0 = time.perf_counter() if started is None else started
        seeds = None if seed_share is None else t0 + seed_share * time_limit
        return cls(seeds, t0 + time_limit)

    def seed(self, name: str, fn, until: float | None = None):
        """fn() within the seeds' share (or until `until`); None (and `name` recorded) when
        it ran out."""
        t0 = time.perf_counter()
        try:
            out = call_until(fn, self.seeds if until is None else until)
        except OutOfTime:
            self.skipped.append(name)
            print(f"tag: seed {name}: out of time after {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
            return None
        print(f"tag: seed {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        return out


def run_search(ctx: PlanContext, playouts: int, seed: int = 0, time_limit: float | None = None,
               net=None, max_groups: int = 24, progress: mcts.Progress | None = None,
               use_anchors: bool = True, started: float | None = None,
               with_placement: bool = False, widen: bool = True,
               seed_share: float | None = SEED_SHARE) -> Outcome:
    """The search on `ctx` (module docstring); `net`: a `topoctl.tag.gnn.TagNet` for the prior,
    None for uniform; `use_anchors`: value the anchors first (off: to measure the prior);
    `time_limit`: seconds for everything from `started` (default: now), seeds included
    (`Budget`: the trees/topoopt kinds, the SFB program and, `with_placement`, the placement
    strategy's pipeline get `seed_share` of it, by default all they need, the search the
    rest); `widen`: the space
    with unequal replica counts, per-stage trees and batch shares (docs/tag.md)."""
    budget = Budget.of(time_limit, started, seed_share)
    groups = op_groups(ctx, max_groups)
    ev = Evaluator(ctx, groups)
    # seeds, cheap ones first: the ring (the baseline), shares, placement, SFB, trees, topoopt
    kinds = _dp_kinds(ctx, ev, budget, ("ring", "ring+shares"))
    other = budget.seed("placement", lambda: _placement_seed(ctx, ev)) if with_placement \
        else None
    sfb = budget.seed("sfb", lambda: _sfb_choice(ctx, ev, groups)) if use_anchors else None
    kinds = _dp_kinds(ctx, ev, budget, ("trees", "trees+shares", "topoopt"), kinds)
    space = build_space(ctx, groups, kinds, widen, ev.times)
    jg = joint_graph_of(ctx, groups, ev)
    prior = None
    if net is not None:
        from topoctl.tag.prior import net_prior  # lazily: torch
        prior = net_prior(net, space, jg)
    if not kinds and not space.sizes:
        raise StrategyError("nothing to search: data parallelism is off and the ranks are "
                            "not one per host (stages need that)")
    if not kinds:  # no data parallelism: the empty state completes to one stage
        space = replace(space, dp_kinds=())
    base = ev.time(plan_of(complete(space, ()))) if kinds else math.inf
    if not math.isfinite(base):
        base = min((ev.time(plan_of(s)) for s in anchors(space, groups)), default=math.inf)
    if not math.isfinite(base):
        raise StrategyError("no plan fits in the hosts' memory")

    times = ev.times

    def value(state: State) -> tuple[float, State]:
        fulls = [_complete_any(space, state)] + lookahead(space, state, times)
        return max((reward(base, ev.time(plan_of(f))), -k, f) for k, f in enumerate(fulls))[::2]

    start = anchors(space, groups, sfb or frozenset()) if use_anchors else []
    left = None if budget.end is None else max(0.0, budget.end - time.perf_counter()
                                               - final_reserve(ev))
    res = mcts.search(lambda s: _legal(space, s), value, playouts,
                      prior or mcts.uniform, seed=seed, time_limit=left,
                      progress=progress, start=start)
    state, walk = res.best_state, None
    if use_anchors:
        state, walk = _walk(space, ev, base, playouts, seed, budget, res)
    return Outcome(state, ev.time(plan_of(state)), base, res, space, groups,
                   ev, jg, other, budget.skipped, walk)


def _walk(space: Space, ev: Evaluator, base: float, steps: int, seed: int, budget: Budget,
          res: mcts.SearchResult) -> tuple[State, dict]:
    """After the tree: FlexFlow's Metropolis-Hastings walk (`topoctl.tag.mcmc`) from the
    baseline, `steps` steps with the search's seed, on the same space and cached values,
    until the budget's end (less `final_reserve`); the better of its best and the tree's. It
    reaches deep pipelines of unequal replica sets (4-5 stages) the tree does not in the
    same number of playouts (docs/results.md, TAG evaluation 1), the tree the plans a walk
    from the baseline does not. Deterministic for a seed when the budget does not cut it.
    O(steps * groups) besides one value call per step (most of them cached)."""
    t0 = time.perf_counter()
    end = None if budget.end is None else budget.end - final_reserve(ev)
    best, v, hist = mcmc.search(space, lambda s: reward(base, ev.time(plan_of(s))), steps,
                                seed=seed, deadline=end)
    cut = hist[-1][0] < 0
    better = v > res.best_value
    print(f"tag: walk (MCMC) {-hist[-1][0] if cut else steps} steps in "
          f"{time.perf_counter() - t0:.1f} s, {'better' if better else 'not better'} than the "
          "tree's best", file=sys.stderr, flush=True)
    return (best if better else res.best_state), {
        "steps": -hist[-1][0] if cut else steps, "stopped_by_time": cut, "chosen": better}


def final_reserve(ev: Evaluator) -> float:
    """Seconds the search leaves of `time_limit` for the planner's own simulation of the
    chosen plan (`planner.evaluate`: one isolated iteration; the steady-state period is
    passed on, `Strategy.period`): the slowest valuation so far (the seeds' plans, up to
    `STEADY_ITERATIONS` iterations each) over `STEADY_ITERATIONS`."""
    return ev.seconds / STEADY_ITERATIONS


LOOKAHEAD = 3  # next-stage host sets a staged node's value tries besides the default
CUT_WINDOW = 3  # cuts tried on the best set: the compute-balanced one and 3 either side


def lookahead(space: Space, state: State, times: list[list[float]]) -> list[State]:
    """Completions of a staged `state` that give the rest of the model to one more stage:
    on the free host set where the remaining groups run fastest, the cut where the current
    stage's and the new stage's compute balance (a stage runs at its slowest member's pace,
    its replicas splitting the rows) and `CUT_WINDOW` cuts either side of it (the activations
    a cut sends are left to the simulator); on the next `LOOKAHEAD` - 1 sets, the balanced
    cut. Sets of the stage's replica count; in a space of unequal counts
    (`Space.equal_replicas` False) also the fastest set of each other count, balanced cut.
    The node's value is the best of these and the default (a rollout policy: a partial
    pipeline is valued by what it can become, not only by running the rest on the current
    stage). O((LOOKAHEAD + sizes) * groups) completions, most of them shared with the node's
    neighbours (the evaluator caches per plan)."""
    i, n = len(state), space.groups
    if not state or state[0][0] != "stage" or i >= n:
        return []
    first = max(k for k, a in enumerate(state) if a[0] == "stage")
    cur = [space.hosts.index(h) for h in state[first][1]]
    free = [h for h in space.hosts if h not in used_hosts(state)]
    wide = not space.equal_replicas

    def pace(hs: list[int], a: int, b: int) -> float:
        div = len(hs) if wide else 1  # equal counts: the same divisor everywhere
        return sum(max(times[j][h] for h in hs) for j in range(a, b)) / div

    def ranked(size: int) -> list[list[int]]:
        sets = [[space.hosts.index(h) for h in s] for s in host_sets(space, free, size)]
        return sorted(sets, key=lambda hs: (pace(hs, i, n), hs))

    tries = [(hs, r == 0) for r, hs in enumerate(ranked(len(cur))[:LOOKAHEAD])]
    if wide:
        tries += [(s[0], False) for g in space.sizes if g != len(cur) and (s := ranked(g))]
    out = []
    for hs, window in tries:
        bal = min(range(i, n), key=lambda c: (max(pace(cur, first, c), pace(hs, c, n)), c))
        cuts = range(max(i, bal - CUT_WINDOW), min(n, bal + CUT_WINDOW + 1)) if window else [bal]
        new = ("stage", tuple(space.hosts[h] for h in hs), "none" if len(hs) == 1 else "ring")
        out += [state + (("same",),) * (k - i) + (new,) + (("same",),) * (n - k - 1)
                for k in cuts]
    return out


def _sfb_choice(ctx: PlanContext, ev: Evaluator, groups: list[Group]) -> frozenset[str]:
    """The layers the `+sfb` post-pass's 0/1 program picks on the ring plan (none when SFB is
    not in the space: no fully connected layer, or several ranks per host)."""
    base = ev.dp_strategy("ring") if ctx.job.parallelism.data else None
    if not any(g.linear for g in groups) or ctx.world_size != len(ctx.hosts) or base is None:
        return frozenset()
    try:
        layers = _sfb.with_sfb(ctx, base).notes["sfb"]["layers"]
    except StrategyError:
        return frozenset()
    return frozenset(v["op"] for v in layers.values())


def _legal(space: Space, state: State) -> list:
    return legal(space, state)


def _complete_any(space: Space, state: State) -> State:
    """`complete`, with the empty state of a space without data parallelism as one stage on
    the fastest host."""
    if not state and not space.dp_kinds:
        state = (("stage", (space.order[0],), "none"),)
    return complete(space, state)


def _dp_kinds(ctx: PlanContext, ev: Evaluator, budget: Budget | None = None,
              cands: tuple[str, ...] = DP_KINDS, have: tuple[str, ...] = ()
              ) -> tuple[str, ...]:
    """The data-parallel kinds of `cands` that plan this job (none without
    `parallelism.data`); the ``+shares`` kinds only when the hosts' speeds differ (otherwise
    the same plan) and their base kind plans (in `have` or found here); the ``topoopt``
    strategy's whole plan on direct-connect fabrics. Each kind is planned and simulated (its
    anchor's value, cached) within the `budget`'s seed share (the ring, the baseline every
    value is relative to, always); `trees` first with its fusion search in half of what is
    left of the share, then, if that ran out, with the job's bucket cap alone
    (`Evaluator.fixed_fusion`)."""
    if not ctx.job.parallelism.data:
        return ()
    budget = budget or Budget()
    differ = len({_shares.host_speed(ctx, h) for h in ctx.hosts}) > 1
    kinds = list(have)
    for k in cands:
        base = k.removesuffix("+shares")
        if (k != base and (not differ or base not in kinds)) or (
                k == "topoopt" and ctx.fabric.kind != "direct"):
            continue
        if k == "trees" and budget.seeds is not None:
            t0 = time.perf_counter()
            half = t0 + (budget.seeds - t0) / 2
            try:
                call_until(lambda: _valued(ev, "trees"), half)
            except OutOfTime:
                if "trees" not in ev._dp:  # still planning: plan it again, cheaper
                    ev.fixed_fusion = True
                    budget.skipped.append("trees fusion search")
            print(f"tag: seed trees with its fusion search: {time.perf_counter() - t0:.1f} s"
                  + ("" if "trees" in ev._dp else " (out of time)"), file=sys.stderr,
                  flush=True)
        if k != "ring" and budget.seed(k, lambda k=k: _valued(ev, k)) is None:
            continue
        if ev.dp_strategy(k) is not None:
            kinds.append(k)
    return tuple(k for k in DP_KINDS if k in kinds)


def _valued(ev: Evaluator, kind: str) -> float:
    """`kind` planned and its data-parallel plan simulated (both cached in `ev`)."""
    ev.dp_strategy(kind)
    return ev.time(Plan("dp", kind))


def emit(ctx: PlanContext, out: Outcome) -> Strategy:
    """The Strategy the planner renders for the search's best state: the data-parallel plan
    (``+shares`` / ``+sfb`` as decided) or the pipeline collective with per-stage sync, named
    ``tag``, each group's decision in `notes["tag"]`."""
    plan, ev = plan_of(out.state), out.evaluator
    if plan.form == "dp":
        base = ev.dp_strategy(plan.kind)
        if plan.sfb:
            layers = [o for i in plan.sfb for o in out.groups[i].linear]
            s = _sfb.with_sfb(ctx, base, layers)
            s.notes["sfb"].pop("forced", None)
        else:
            s = replace(base, notes=dict(base.notes))
    else:
        s = pipeline_strategy(ctx, plan, ev)
    if not plan.sfb:  # the very tasks the evaluator valued (SFB's are built anew here)
        s.period = out.time
    s.name = "tag"
    s.notes["tag"] = _notes(out)
    return s


def pipeline_strategy(ctx: PlanContext, plan: Plan, ev: Evaluator) -> Strategy:
    """The pipeline Strategy of staged `plan` (as `placement.search` writes one; with unequal
    replica counts or batch shares, every stage's `shares` as `placement.search_shape`
    writes them)."""
    stages, hgroups, syncs, micro, scale, meas, shares, at = ev.pp_parts(plan)
    tasks, grads = gpipe.pipeline_tasks(ctx, stages, hgroups, micro, scale, meas, syncs,
                                             shares, at)
    net = gpipe.lab_network(ev.network, list(ctx.hosts), meas, ctx.fabric.mtu)
    stage_of = {op: i for i, ops in enumerate(stages) for op in ops}
    g = len(hgroups[0])
    mb = ctx.job.batch.global_ // (g * micro) if shares is None else shares[0][0]
    # send_bytes: what `micro_batch` rows send (render.pipeline)
    cut = gpipe.cut_bytes(ctx, stage_of, len(stages), scale if shares is None
                               else mb * scale)
    replicas = g if shares is None else max(len(grp) for grp in hgroups)
    coll = {"algorithm": "pipeline", "schedule": "gpipe", "microbatches": micro,
            "micro_batch": mb, "replicas": replicas,
            "stages": [{"hosts": list(grp), "ranks": [ctx.ranks[h][0] for h in grp],
                        "ops": list(ops), **({"shares": shares[i]} if shares else {}),
                        "send_bytes": int(cut[i]) if i < len(cut) else 0,
                        "sync": syncs[i]}
                       for i, (grp, ops) in enumerate(zip(hgroups, stages, strict=True))]}
    notes: dict = {"stages": len(stages),
                   "replicas": g if shares is None else [len(grp) for grp in hgroups],
                   "sync": [{"kind": y["kind"], **({"server": y["server"]} if "server" in y
                                                   else {})} for y in syncs]}
    if meas is not None:  # what the lab prediction rests on (docs/placement.md)
        notes["compute"] = {"cost": "measured on this CPU at the micro-batch",
                            "micro_batch": mb, "threads": ctx.job.launch.threads,
                            "runtime_cpu": meas.runtime.source}
    return Strategy(name="tag", fabric=ctx.fabric, hops=ev.hops, network=net, tasks=tasks,
                    collective=coll, buckets=[b for b in grads if b], notes=notes)


def _notes(out: Outcome) -> dict:
    """The plan's record of the search: each group's decision, the budget, the value."""
    rows = []
    for i, (g, a) in enumerate(zip(out.groups, out.state, strict=True)):
        rows.append({"group": i, "ops": len(g.ops), "first": g.ops[0], "last": g.ops[-1],
                     "decision": describe(a)})
    return {"groups": rows, "playouts": out.result.playouts,
            "simulated_plans": len(out.evaluator.cache),
            "stopped_by_time": out.result.stopped_by_time or bool(out.skipped) or bool(
                out.walk and out.walk["stopped_by_time"]),
            **({"walk": out.walk} if out.walk else {}),
            **({"out_of_time": list(out.skipped)} if out.skipped else {}),
            "speedup_over_baseline": (out.base_time / out.time
                                      if math.isfinite(out.base_time) else None)}


def _stderr_progress(t0: float):
    def show(done: int, total: int, best: float) -> None:
        print(f"tag: {done}/{total} playouts, best {best + 1:.3g}x the baseline, "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return show


def plan(ctx: PlanContext) -> Strategy:
    """Strategy ``tag``: the search with the job's `tag` options (budget, seed, prior); the
    `placement` strategy's pipeline when it is faster (`_adopt_placement`)."""
    opts = ctx.job.tag
    t0 = time.perf_counter()
    net = None
    if opts.prior == "gnn":
        from topoctl.tag.prior import shipped  # lazily: torch
        net = shipped()
    out = run_search(ctx, opts.playouts, opts.seed, opts.time_limit, net, opts.max_groups,
                     _stderr_progress(t0), started=t0, with_placement=True)
    print(f"tag: {out.result.playouts} playouts, {len(out.evaluator.cache)} plans simulated "
          f"in {time.perf_counter() - t0:.1f} s"
          + (f"; out of time for: {', '.join(out.skipped)}" if out.skipped else ""),
          file=sys.stderr, flush=True)
    other = _adopt_placement(out)
    if other is not None:
        print(f"tag: the placement search's pipeline ({other.notes['tag']['adopted']}) is "
              "faster than the tree's best (or as fast on fewer hosts): adopted",
              file=sys.stderr, flush=True)
        return other
    return emit(ctx, out)


def _placement_seed(ctx: PlanContext, ev: Evaluator) -> tuple[Strategy, float] | None:
    """The `placement` strategy's pipeline and its simulated time (None when it cannot plan
    the job)."""
    try:
        p = _placement.search(ctx, ctx.job.parallelism.search, "placement")
    except (StrategyError, TopoError):
        return None
    return p, ev._sim(p)


# predicted times this close are a tie (the lab measures them to a few per cent): the plan on
# fewer hosts wins it (the demo's job: a two-stage plan on two hosts tied with the whole model
# on one, 0.105 s each, and measured 0.129 s against the one host's 0.109 s)
TIE = 0.01


def placement_wins(placement_s: float, placement_hosts: int, best_s: float,
                   best_hosts: int) -> bool:
    """Whether the placement search's plan (`placement_s` seconds per iteration on
    `placement_hosts` hosts) beats the tree search's best: faster, or within `TIE` of it on
    fewer hosts. O(1)."""
    return placement_s < best_s or (placement_hosts < best_hosts
                                    and placement_s <= best_s * (1 + TIE))


def _adopt_placement(out: Outcome) -> Strategy | None:
    """The `placement` strategy's pipeline when it is faster than the search's best (its
    stages need not be contiguous in TAG's group order, and its MILP/HEFT placement may cut
    inside a merged group), or as fast (within `TIE`) on fewer hosts, renamed ``tag`` with
    each group's stage in its notes; None otherwise or when it was not planned. So `tag` is
    never slower than `placement`."""
    if out.placement is None:
        return None
    p, t = out.placement
    if not placement_wins(t, len({h for st in p.collective["stages"] for h in st["hosts"]}),
                          out.time, len(used_hosts(out.state) or out.space.hosts)):
        return None
    stage_of = {op: i for i, st in enumerate(p.collective["stages"]) for op in st["ops"]}
    notes = _notes(out)
    for row, g in zip(notes["groups"], out.groups, strict=True):
        k = next((stage_of[o] for o in g.ops if o in stage_of), None)
        if k is None:
            row["decision"] = "-"
            continue
        st, y = p.collective["stages"][k], p.collective["stages"][k]["sync"]
        row["decision"] = (f"stage {k} on {','.join(st['hosts'])}, sync {y['kind']}"
                           + (f":{y['server']}" if "server" in y else ""))
    notes["adopted"] = f"placement, {p.notes.get('search')}"
    notes["speedup_over_baseline"] = (out.base_time / t if math.isfinite(out.base_time)
                                      else None)
    p.name, p.notes, p.period = "tag", dict(p.notes) | {"tag": notes}, t
    return p


PLANNER_STRATEGIES = {"tag": plan}
