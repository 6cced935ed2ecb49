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
    from topoctl.sim.network import Network
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
    cpu_pool: tuple[frozenset[str], int] | None = None
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
STRATEGIES: dict[str, StrategyFn] = {}


def register(name: str, fn: StrategyFn) -> None:
    """Register strategy function `fn` under `name` (replacing one of the same name)."""
    STRATEGIES[name] = fn


_discovered = False


def available() -> dict[str, StrategyFn]:
    """All strategies: registered ones plus every `PLANNER_STRATEGIES` of this package."""
    global _discovered
    if not _discovered:
        _discovered = True
        for info in pkgutil.iter_modules(__path__):
            mod = importlib.import_module(f"{__name__}.{info.name}")
            for name, fn in getattr(mod, "PLANNER_STRATEGIES", {}).items():
                STRATEGIES.setdefault(name, fn)
    return STRATEGIES


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
