"""Strategies: functions `(PlanContext) -> Strategy`, registered by name in `STRATEGIES`.

A `PlanContext` is what every strategy starts from (the validated cluster and job, the fabric as
plain data, the training hosts and ranks, the op graph at the per-rank batch and per-op costs per
host). A `Strategy` is everything the simulator needs to score it (`tasks` on `network`) and
everything the renderer needs to write the plan (fabric, routing, collective, QoS rates).
`topoctl.planner` runs the job's strategies, simulates each, and renders the fastest.

Plugging in a strategy: any module in this package may define
`PLANNER_STRATEGIES = {"name": fn}`; `available()` imports the package's modules once and
registers them (or call `register(name, fn)` yourself). Data-parallel strategies can reuse
`baseline.dp_tasks(ctx, order, algorithm)` with another member order or collective algorithm.

Post-passes rewrite a finished strategy (`fn(ctx, base) -> Strategy`) and are declared once,
with the decorator `post_pass(name, applies_to=bases, after=passes)`. A job names a base and
its passes in order, ``base+pass[+pass...]`` (a pass alone means ``baseline+pass``);
`resolve` builds any such composition the declarations allow and refuses the others with a
StrategyError naming what is allowed (`allowed`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from topoagent.protocol import TopoError
from topoctl.lab.cpu import device_quotas as lab_device_quotas
from topoctl.labprofile import DEFAULT_LAB, LabProfile

if TYPE_CHECKING:  # annotations only: importing topoctl.strategies.<algorithm> (bounds, trees)
    # must not pull in torch through the graph and job modules
    from topoctl.fabric.graph import FabricGraph
    from topoctl.graph.cost import OpCost, TrainCost
    from topoctl.graph.devices import Device
    from topoctl.graph.ops import OpGraph
    from topoctl.sim.network import CpuPool, Network
    from topoctl.sim.routing import NextHops
    from topoctl.sim.tasks import Task
    from topoctl.spec.cluster import Cluster
    from topoctl.spec.job import Job


class StrategyError(TopoError, ValueError):
    """This strategy cannot plan this job (e.g. trees on one host); the planner reports it at
    the job's `strategies[i]`. A fabric that cannot carry the job raises FabricError or
    RoutingError instead (reported against the cluster)."""


@dataclass
class PlanContext:
    """What every strategy starts from: cluster, job, fabric, training hosts and ranks, op graph and
    per-op costs."""

    cluster: Cluster
    job: Job
    fabric: FabricGraph
    hosts: list[str]  # training hosts in rank order
    ranks: dict[str, list[int]]  # host -> its global ranks (one per GPU)
    local_batch: int  # samples per rank per iteration
    graph: OpGraph  # captured at local_batch
    device: dict[str, Device]  # host -> device type used for its costs
    costs: dict[str, dict[str, OpCost]]  # device type name -> op -> cost
    use_cache: bool = True  # machine caches (op times, the runtime's CPU calibration) allowed
    # lab hosts (every training host a `cpu`, no `cost.device`) with the caches allowed: per-op
    # training costs timed on this CPU at a given batch (`graph.profile.measure_train_job`,
    # cached; `runtime="stage"`: fitted to the pipeline runtime's path); the pipeline strategies
    # cost their micro-batches with it. None: roofline/profile
    train_costs: Callable[..., dict[str, TrainCost] | None] | None = None
    # with `train_costs`: CPU seconds a pipeline rank spends drawing the iteration's global
    # batch of so many samples (`graph.profile.measure_batch_inputs`)
    inputs_cost: Callable[[int], float] | None = None
    # with `train_costs`: a pipeline stage's CPU time at a micro-batch beside so many
    # co-running copies over alone (`graph.profile.measure_stage_crowding`)
    crowded_ratio: Callable[[int, int], float | None] | None = None
    # lab hosts whose ranks' compute was timed on this CPU (`planner.prepare`): the ranks share
    # this machine's cores (processor sharing in the simulator, `Network.cpu_pool`); every
    # strategy builds its network with it (`network_from_fabric(..., cpu_pool=...)`)
    cpu_pool: CpuPool | tuple[frozenset[str], int] | None = None
    step_s: float | None = None  # a rank's optimiser step timed on this CPU (lab), else roofline
    # lab ranks timed on this CPU: what the runtime's copy of gradients into a bucket's buffer
    # costs the rank's main thread, (seconds per parameter, bytes per second) from the runtime
    # calibration (`strategies.disco.flatten_s`); None elsewhere
    bucket_copy: tuple[float, float] | None = None
    # the lab machine's facts (cores the ranks share, cable emulation cost, cable credit), read
    # once by `planner.prepare` (`labprofile.machine_profile`); strategies take them from here
    # when they cost ranks that all run on one machine
    lab: LabProfile = DEFAULT_LAB

    @property
    def world_size(self) -> int:
        """Number of ranks over all training hosts."""
        return sum(len(r) for r in self.ranks.values())

    def host_costs(self, host: str) -> dict[str, OpCost]:
        """Per-op costs on `host`'s device type."""
        return self.costs[self.device[host].name]


@dataclass
class Strategy:
    """A complete strategy. `routes` overrides `hops` per (src host, dst host) with weighted
    next-hop nodes (multipath); `rates` are per-(src host, dst host) bandwidth allocations in
    bit/s, rendered as QoS classes on the source's egress port and used as caps by the
    simulator; `collective` says how the launcher synchronises gradients.

    `topoopt` sets `routes` (equal-cost multipath) and `extra` (tc-offload forwarding); the
    `+bandwidth` post-pass sets `extra` (QoS classes, policy-routed multipath, ip_forward); no
    strategy sets `rates` yet (the renderer and simulator honour it)."""

    name: str
    fabric: FabricGraph
    hops: NextHops
    network: Network
    tasks: list[Task]
    collective: dict[str, Any]
    buckets: list[int]  # gradient bucket sizes in bytes, in all-reduce order
    bucket_cap: int | None = None  # DDP bucket cap the launcher uses; None: the job's
    routes: dict[tuple[str, str], list[tuple[str, float]]] = field(default_factory=dict)
    rates: dict[tuple[str, str], int] = field(default_factory=dict)
    # host -> HostState sections appended verbatim after rendering, e.g. {"rules": [...],
    # "routes": [...]} for policy routing in custom tables (the schema still validates them);
    # a mapping section (e.g. {"sysctl": {"ip_forward": True}}, "forwarding") is merged key by key
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    # the steady-state period of exactly these `tasks` on `network` (with the hosts' speeds:
    # `planner.evaluate`'s `steady_period`) when the strategy already simulated it (`tag`
    # values its plans so): the planner does not simulate it again; None: it does
    period: float | None = None


StrategyFn = Callable[[PlanContext], Strategy]
PostPassFn = Callable[[PlanContext, Strategy], Strategy]
STRATEGIES: dict[str, StrategyFn] = {}  # the bases: strategies that plan from the context
ALONE = "baseline"  # the base a post-pass named alone applies to


@dataclass(frozen=True)
class PostPass:
    """A post-pass as declared (`post_pass`): `fn(ctx, base)` rewrites the finished strategy
    `base`; it applies to the bases `applies_to` and may follow the passes `after`."""

    name: str
    fn: PostPassFn
    applies_to: tuple[str, ...]
    after: tuple[str, ...] = ()


POST_PASSES: dict[str, PostPass] = {}
_composed: dict[str, StrategyFn] = {}  # one function per composition: aliases share it


def register(name: str, fn: StrategyFn) -> None:
    """Register strategy function `fn` under `name` (replacing one of the same name)."""
    STRATEGIES[name] = fn


def post_pass(name: str, applies_to: tuple[str, ...],
              after: tuple[str, ...] = ()) -> Callable[[PostPassFn], PostPassFn]:
    """Decorator declaring `fn(ctx, base) -> Strategy` the post-pass `name`, for the bases
    `applies_to`, allowed after the passes `after` (``base+p1+name`` needs p1 in `after`)."""
    def declare(fn: PostPassFn) -> PostPassFn:
        POST_PASSES[name] = PostPass(name, fn, tuple(applies_to), tuple(after))
        return fn
    return declare


_discovered = False


def _discover() -> None:
    """Import the package's modules once: their `PLANNER_STRATEGIES` and `post_pass`es."""
    global _discovered
    if not _discovered:
        _discovered = True
        for info in pkgutil.iter_modules(__path__):
            mod = importlib.import_module(f"{__name__}.{info.name}")
            for name, fn in getattr(mod, "PLANNER_STRATEGIES", {}).items():
                STRATEGIES.setdefault(name, fn)


def available() -> dict[str, StrategyFn]:
    """The named strategies: every base, every ``base+pass`` the post-passes declare, and each
    pass alone (``baseline+pass``). Longer compositions resolve too (`resolve`)."""
    _discover()
    out = dict(STRATEGIES)
    for p in POST_PASSES.values():
        for b in p.applies_to:
            if b in STRATEGIES:
                out[f"{b}+{p.name}"] = resolve(f"{b}+{p.name}")
        if ALONE in p.applies_to and ALONE in STRATEGIES:
            out[p.name] = resolve(p.name)
    return out


def allowed() -> str:
    """What a job's `strategies` may name, in words (for errors and help)."""
    _discover()
    passes = "; ".join(
        f"+{p.name} on {'/'.join(p.applies_to)}"
        + (f", after {'/'.join('+' + a for a in p.after)}" if p.after else "")
        for p in sorted(POST_PASSES.values(), key=lambda p: p.name))
    return (f"bases: {', '.join(sorted(STRATEGIES))}; post-passes, in order after a base "
            f"(base+pass[+pass...]; a pass alone means {ALONE}+pass): {passes}")


def composition(name: str) -> tuple[str, tuple[str, ...]]:
    """`name` as (base, passes in order), checked against the declarations; StrategyError
    naming what is allowed when it is not a strategy."""
    _discover()
    if name in STRATEGIES:
        return name, ()
    parts = name.split("+")
    if len(parts) == 1 and name in POST_PASSES:
        parts = [ALONE, name]
    base, passes = parts[0], tuple(parts[1:])
    why = None
    if base not in STRATEGIES:
        why = f"no base strategy {base!r}"
    for i, p in enumerate(passes):
        if why:
            break
        decl = POST_PASSES.get(p)
        if decl is None:
            why = f"no post-pass {p!r}"
        elif base not in decl.applies_to:
            why = f"+{p} does not apply to {base} (only to {'/'.join(decl.applies_to)})"
        elif p in passes[:i]:
            why = f"+{p} twice"
        elif any(q not in decl.after for q in passes[:i]):
            q = next(q for q in passes[:i] if q not in decl.after)
            why = (f"+{p} cannot follow +{q}"
                   + (f" (only +{'/+'.join(decl.after)})" if decl.after else
                      " (it comes right after the base)"))
    if why:
        word = "unknown strategy" if why.startswith("no ") else "strategy not allowed"
        raise StrategyError(f"{word} {name!r}: {why}; {allowed()}")
    return base, passes


def resolve(name: str) -> StrategyFn:
    """The function planning strategy `name`: a base, or a base with its post-passes applied
    in order (`composition`); StrategyError naming what is allowed otherwise."""
    base, passes = composition(name)
    if not passes:
        return STRATEGIES[base]
    key = "+".join((base,) + passes)
    if key not in _composed:
        def plan(ctx: PlanContext) -> Strategy:
            s = STRATEGIES[base](ctx)
            for p in passes:
                s = POST_PASSES[p].fn(ctx, s)
            return s
        plan.__doc__ = f"Strategy {key}: {base}, then the post-passes {', '.join(passes)}."
        _composed[key] = plan
    return _composed[key]


def host_speeds(ctx: PlanContext) -> dict[str, float]:
    """Each training host's compute rate for the simulator (`Network.speed`). Ranks timed for
    the lab (`ctx.cpu_pool`): the fixed CPU share in cores the lab gives each of the host's
    ranks, every host included (`topoctl.lab.cpu.device_quotas` over all the cluster's hosts,
    their speeds, None meaning 1, their devices and `ctx.lab.cores`: the formula `topoctl lab
    up` enforces). Otherwise, from the cluster's `hosts[].speed`: {} when no host states one
    (plans as before); hosts of type `cpu` run at their `speed` (their op and step times scale
    by 1/speed) and other device types keep their roofline."""
    stated = {h.name: h.speed for h in ctx.cluster.hosts}
    if ctx.cpu_pool is not None:
        devices = {h.name: ctx.cluster.gpus(h.name).count for h in ctx.cluster.hosts}
        q = lab_device_quotas(stated, ctx.lab.cores, devices)
        return {h: q[h] for h in ctx.hosts if h in q}
    if all(stated.get(h) is None for h in ctx.hosts):
        return {}
    return {h: float(stated[h]) for h in ctx.hosts
            if stated.get(h) is not None and ctx.cluster.gpus(h).type == "cpu"}
