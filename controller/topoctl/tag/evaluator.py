"""TAG's reward: a plan's iteration time on the project's simulator.

Every TAG plan (`topoctl.tag.space.Plan`: data-parallel of a kind, or pipeline stages on replica
sets) is built into the simulator's tasks exactly as the planner builds the emitted plan (host
speeds, lab cores, the steady-state period when iterations overlap) and simulated once: values
are cached per canonical plan. Data-parallel kinds are the other strategies' plans (`Kit`);
pipelines use the GPipe iteration model (`Kit.pipeline`). A plan whose part does not fit a
host's memory (4 x parameters + activations of every micro-batch in flight,
`placement.build.node_memory`) is infinitely slow. Reward (TAG, Zhang et al., IEEE TPDS 2023,
without its fourth root): r - 1, r = t_baseline / t.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from topoagent.protocol import TopoError
from topoctl.apportion import apportion
from topoctl.fabric.graph import connection_links
from topoctl.placement.build import node_memory
from topoctl.placement.stagesync import stage_trees
from topoctl.sim.engine import simulate
from topoctl.sim.fabric import network_from_fabric, tcp_efficiency
from topoctl.sim.routing import shortest_next_hops
from topoctl.sim.steady import overlaps_iterations, steady_period
from topoctl.tag.problem import Group, group_times
from topoctl.tag.space import Plan, Stage, split_sync

if TYPE_CHECKING:  # annotations only
    from topoctl.strategies import PlanContext, Strategy
    from topoctl.tag.kit import Kit

STEADY_ITERATIONS = 3  # as the planner: ranks leaving a collective one by one


def reward(t_base: float, t: float) -> float:
    """The speed-up over the baseline less one, r - 1 with r = t_base / t (the paper's
    reward without its fourth root above 1: the search normalises values to the range it has
    seen, and the root would hide the differences between good plans); -1 when the plan does
    not fit (t infinite)."""
    if not math.isfinite(t) or t <= 0:
        return -1.0
    return t_base / t - 1.0


class Evaluator:
    """Simulated iteration time of a TAG plan on the context (cached per canonical plan)."""

    def __init__(self, ctx: PlanContext, groups: list[Group], kit: Kit):
        self.ctx, self.groups, self.kit = ctx, groups, kit
        self.hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
        self.network = network_from_fabric(ctx.fabric, self.hops)
        self.cache: dict[Plan, float] = {}
        self.seconds = 0.0  # wall clock of the slowest valuation so far (`final_reserve`)
        self._dp: dict[str, Strategy | None] = {}
        self.speeds = kit.host_speeds(ctx)
        self.memory = {h: ctx.device[h].memory for h in ctx.hosts}
        self.fixed_fusion = False  # `trees` kinds with the job's bucket cap only (`seeds`)
        self._trees: dict[tuple, dict | None] = {}  # a stage's packed trees, per hosts/bytes
        self.times = group_times(ctx, groups, self.speeds)

    def planned(self, kind: str) -> bool:
        """Whether the data-parallel `kind` has been planned (successfully or not)."""
        return kind in self._dp

    def dp_strategy(self, kind: str) -> Strategy | None:
        """The data-parallel strategy of `kind` (None when it cannot plan this job)."""
        if kind not in self._dp:
            base, _, shares = kind.partition("+")
            ctx = self.ctx
            if base == "trees" and self.fixed_fusion:
                sync = ctx.job.sync.model_copy(update={"fusion": "fixed"})
                ctx = replace(ctx, job=ctx.job.model_copy(update={"sync": sync}))
            try:
                s = self.kit.plans[base](ctx)
                self._dp[kind] = self.kit.with_shares(self.ctx, s) if shares else s
            except TopoError:  # StrategyError, FabricError: e.g. topoopt on a switched fabric
                self._dp[kind] = None
        return self._dp[kind]

    def simulate(self, s: Strategy) -> float:
        """Seconds per iteration of Strategy `s` as `planner.evaluate` simulates it."""
        net = replace(s.network, speed=self.speeds, _cache={}) if self.speeds else s.network
        return self._period(s.tasks, net)

    @staticmethod
    def _period(tasks, net) -> float:
        if overlaps_iterations(tasks):  # as `planner.evaluate`
            return steady_period(tasks, net, STEADY_ITERATIONS)
        return simulate(tasks, net, record=False).iteration_time

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
                for op, _, k, m, n in self.kit.linear_layers(self.ctx.graph)}
        tasks, sizes = self.kit.sfb_tasks(self.ctx, chosen, info)
        return replace(base, tasks=tasks, buckets=sizes)

    def _dp_time(self, plan: Plan) -> float:
        need = node_memory(sum(g.param_bytes for g in self.groups),
                           sum(g.act_bytes for g in self.groups), 1, self.ctx.graph.dtype_bytes)
        if any(need > m for m in self.memory.values()):
            return math.inf
        s = self.dp_plan(plan)
        return math.inf if s is None else self.simulate(s)

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
        ctx, model = self.ctx, self.kit.pipeline
        pos = {o.name: i for i, o in enumerate(ctx.graph.ops)}
        stages = [sorted((o for g in self.groups[st.first: st.last + 1] for o in g.ops),
                         key=pos.__getitem__) for st in plan.stages]
        hgroups = [list(st.hosts) for st in plan.stages]
        micro = ctx.job.parallelism.microbatches
        shares = self.stage_rows(plan)
        if shares is None:
            g = len(hgroups[0])
            scale = ctx.job.batch.global_ / (g * micro) / ctx.local_batch
            meas = model.measured_stage_costs(ctx, ctx.job.batch.global_ // (g * micro))
            at = None
        else:
            scale = 1.0 / ctx.local_batch
            rows = sorted({x for sh in shares for x in sh})
            at = {r: model.measured_stage_costs(ctx, r) for r in rows}
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
        model = self.kit.pipeline
        nbytes = float(model.grad_bytes(self.ctx, [ops])[0])
        key = (st.hosts, nbytes, meas is None)
        if key not in self._trees:
            costs, lab = model.trees_cpu_model(self.ctx, meas)
            links = [(ln.a, ln.b, ln.capacity / 8.0) for ln in connection_links(self.ctx.fabric)]
            sched = stage_trees(links, list(st.hosts), nbytes, costs, lab,
                                tcp_efficiency(self.ctx.fabric.mtu))
            self._trees[key] = None if sched is None else sched.dump()
        sched = self._trees[key]
        return {"kind": "trees"} if sched is None else {"kind": "trees", "schedule": sched}

    def _fits(self, plan: Plan, scale: float, shares, micro: int) -> bool:
        """Whether every stage member's memory holds its groups at its rows."""
        for s, st in enumerate(plan.stages):
            gs = self.groups[st.first: st.last + 1]
            for j, h in enumerate(st.hosts):
                sc = scale if shares is None else scale * shares[s][j]
                need = sum(node_memory(g.param_bytes, sc * g.act_bytes, micro,
                                       self.ctx.graph.dtype_bytes) for g in gs)
                if need > self.memory[h]:
                    return False
        return True

    def _pp_time(self, plan: Plan) -> float:
        stages, hgroups, syncs, micro, scale, meas, shares, at = self.pp_parts(plan)
        if any(y["kind"] == "trees" and "schedule" not in y for y in syncs):
            return math.inf  # no trees over this stage's own cables
        if not self._fits(plan, scale, shares, micro):
            return math.inf
        model = self.kit.pipeline
        tasks, _ = model.pipeline_tasks(self.ctx, stages, hgroups, micro, scale, meas,
                                        syncs, shares, at)
        net = model.lab_network(self.network, list(self.ctx.hosts), meas, self.ctx.fabric.mtu)
        if self.speeds:
            net = replace(net, speed=self.speeds, _cache={})
        return self._period(tasks, net)


def final_reserve(ev: Evaluator) -> float:
    """Seconds a clocked search leaves of `time_limit` for the planner's own simulation of the
    chosen plan (`planner.evaluate`: one isolated iteration; the steady-state period is
    passed on, `Strategy.period`): the slowest valuation so far (the seeds' plans, up to
    `STEADY_ITERATIONS` iterations each) over `STEADY_ITERATIONS`."""
    return ev.seconds / STEADY_ITERATIONS
