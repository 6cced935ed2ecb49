"""The planning pipeline: cluster + job -> PlanContext -> strategies -> simulate each -> render
the fastest as a Plan. No file I/O here except the profile cache used by measured costs.

Errors are `JobError` / `ClusterError` (topoctl.spec), each problem naming the YAML path in the
file it is about; nothing is written by the caller when one is raised."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from topoctl.collective.hierarchical import device_node
from topoctl.collective.trees.pipeline import runtime_costs
from topoctl.fabric.capgraph import FabricError
from topoctl.fabric.graph import FabricGraph
from topoctl.graph.capture import CaptureError
from topoctl.graph.cost import (
    interpolate_train_costs,
    roofline_costs,
    scale_costs,
    timing_grid,
    totals,
)
from topoctl.graph.devices import DEVICES, Device
from topoctl.graph.profile import (
    device_table,
    job_costs,
    job_graph,
    measure_batch_inputs,
    measure_stage_crowding,
    measure_train_job,
    reporting,
    retime_runtime_calibration,
)
from topoctl.graph.sandbox import session as capture_session
from topoctl.lab.cpu import quotas as lab_quotas
from topoctl.labprofile import LabProfile, machine_profile
from topoctl.placement.runtime import message_cost, rank_op_costs, shared_message_s
from topoctl.render.addressing import AddressingError, assign_cluster
from topoctl.render.hoststate import render_hosts
from topoctl.render.ovs import ovs_host
from topoctl.render.plan import fabric_wiring, launch_spec, plan_document
from topoctl.sim.devices import split_device
from topoctl.sim.engine import SimError, SimResult, simulate
from topoctl.sim.fabric import tcp_efficiency
from topoctl.sim.layout import (
    DeviceGroup,
    OpBytes,
    collectives,
    layout,
    layout_doc,
    overflows,
)
from topoctl.sim.network import CpuPool, MessageCost, pool_host_quotas
from topoctl.sim.routing import RoutingError
from topoctl.sim.steady import overlaps_iterations, steady_period
from topoctl.sim.tasks import Collective, Compute, Transfer
from topoctl.spec.cluster import Cluster, ClusterError
from topoctl.spec.job import Job, JobError
from topoctl.strategies import (
    PlanContext,
    Strategy,
    StrategyError,
    composition,
    host_speeds,
    resolve,
)
from topotrain.timing import load_calibration

PIPELINE_STRATEGIES = frozenset({"placement", "pipeline"})  # need no data parallelism
# bases whose plans keep the whole model on every device at the even per-rank batch, as do the
# post-passes but +shares (it moves samples between hosts): their memory is known before they
# plan (`early_memory_check`)
WHOLE_MODEL_BASES = frozenset({"baseline", "trees", "topoopt"})
LAB_TIMED_MAX_S = 2.0  # a rank's roofline forward + backward up to which lab ranks are timed


@dataclass
class Evaluated:
    """A strategy with its simulated iteration and the planner time it took."""

    strategy: Strategy
    result: SimResult
    seconds: float  # planner time spent on it
    # what each device holds and does (`sim.layout`): the memory check's figures, which the
    # plan carries for `explain`
    layout: list[DeviceGroup] = field(default_factory=list)


def prepare(cluster: Cluster, job: Job, use_cache: bool = True,
            retime: bool = False, lab: LabProfile | None = None) -> PlanContext:
    """Check the job against the cluster and capture + cost the model (`retime`: lab ranks'
    op times and the tree runtime's CPU costs measured again once per process,
    `graph.profile.measure_train_job`, `graph.profile.retime_runtime_calibration`). `lab`:
    the lab machine's facts the strategies use (`PlanContext.lab`); None: this machine's,
    read once here (`labprofile.machine_profile`, after any retiming). A factory model's
    captures share one child process (`graph.sandbox.session`)."""
    with capture_session():
        return _prepare(cluster, job, use_cache, retime, lab)


def _prepare(cluster: Cluster, job: Job, use_cache: bool, retime: bool,
             lab: LabProfile | None) -> PlanContext:
    """`prepare`, inside its capture session."""
    names = {h.name: i for i, h in enumerate(cluster.hosts)}
    if job.hosts is not None:
        probs = []
        for i, h in enumerate(job.hosts):
            if h not in names:
                probs.append((f"hosts[{i}]", f"no host {h} in cluster {cluster.name}"))
            elif cluster.gpus(h).count == 0:
                probs.append((f"hosts[{i}]", f"{h} has no GPUs (gpus.count: 0 in the cluster)"))
        if probs:
            raise JobError(probs)
        hosts = list(job.hosts)
    else:
        hosts = [h.name for h in cluster.hosts if cluster.gpus(h.name).count > 0]
        if not hosts:
            raise ClusterError([("hosts", "no host has GPUs (every gpus.count is 0); nothing "
                                          "can train")])
    if job.forwarding == "tc-offload" and cluster.addressing.family != "ipv4":
        # the agent's offload rules match IPv4 destinations only (tc flower dst_ip, protocol ip)
        raise JobError([("forwarding", f"tc-offload forwards IPv4 only; cluster {cluster.name} "
                                       f"asks for addressing.family: "
                                       f"{cluster.addressing.family} (use forwarding: kernel)")])
    bases = []
    for i, s in enumerate(job.strategies):
        try:
            bases.append(composition(s)[0])
        except StrategyError as e:
            raise JobError([(f"strategies[{i}]", m) for _, m in e.problems]) from None
    dp_only = [s for s, b in zip(job.strategies, bases, strict=True)
               if b not in PIPELINE_STRATEGIES]
    if not job.parallelism.data and dp_only:
        raise JobError([("parallelism.data", f"{', '.join(dp_only)}: data-parallel strategies; "
                                             "allow data: true or list only "
                                             f"{' / '.join(sorted(PIPELINE_STRATEGIES))}")])
    ranks, r = {}, 0
    for h in hosts:
        n = cluster.gpus(h).count
        ranks[h] = list(range(r, r + n))
        r += n
    g = job.batch.global_
    if g % r:
        raise JobError([("batch.global", f"{g} samples do not split evenly over {r} ranks "
                                         f"({len(hosts)} hosts); use a multiple of {r}")])
    table = device_table(cluster)
    device: dict[str, Device] = {}
    measured: dict[str, bool] = {}
    if job.cost.device is not None and job.cost.device not in table:
        raise JobError([("cost.device", f"unknown device type {job.cost.device!r} (known: "
                                        f"{', '.join(sorted(table))}; the cluster's gpu_types "
                                        "add more)")])
    for h in hosts:
        t = job.cost.device or cluster.gpus(h).type
        meas = job.cost.method == "measured" or (job.cost.method == "auto" and t == "cpu")
        if t == "cpu":
            dev = table["CPU"]
        elif t in table:
            dev = table[t]
        else:
            raise ClusterError([(f"hosts[{names[h]}].gpus.type",
                                 f"unknown device type {t!r}: add it to gpu_types "
                                 f"(peak_flops, memory_bandwidth) or use one of "
                                 f"{', '.join(sorted(table))}, cpu")])
        device[h], measured[dev.name] = dev, meas
    try:
        graph = job_graph(job, g // r)
    except CaptureError as e:  # its problems keep their paths (model.inputs, model.factory)
        raise JobError([(f"model.{p}" if p else "model", m) for p, m in e.problems]) from None
    costs = {name: job_costs(job, graph, next(d for d in device.values() if d.name == name),
                             meas, use_cache) for name, meas in measured.items()}
    if job.cost.scale != 1.0:
        costs = {k: scale_costs(v, job.cost.scale) for k, v in costs.items()}
    on_lab = job.cost.device is None and all(cluster.gpus(h).type == "cpu" for h in hosts)
    timed = use_cache and on_lab  # lab ranks are timed on this CPU
    if timed and retime:  # before the profile is read: it comes from the calibration
        retime_runtime_calibration()
    if lab is None:
        lab = machine_profile(use_cache)
    train = _lab_timing(job, retime, lab_corun(r, lab.cores)) if timed else None
    inputs = ((lambda batch: measure_batch_inputs(job, batch, use_cache=True, retime=retime))
              if timed else None)
    crowded = ((lambda batch, copies: measure_stage_crowding(job, batch, copies))
               if timed else None)
    ctx = PlanContext(cluster, job, cluster.graph(), hosts, ranks, g // r, graph, device, costs,
                      use_cache, train, lab=lab, inputs_cost=inputs, crowded_ratio=crowded)
    return _on_lab_cpu(ctx) if train is not None else ctx


def _lab_timing(job: Job, retime: bool, corun: int):
    """`PlanContext.train_costs` for lab ranks: `measure_train_job` at a batch, as `runtime`
    runs it. Data-parallel ranks ("module") are timed beside `corun` copies (every rank
    computes at once); pipeline stages ("stage") alone, since how many stages compute at once
    is what the pipeline strategies search (timed beside 7 copies, the demo's one-host
    pipeline was predicted 0.110 s and ran 0.087 s). Stages are timed at the micro-batches
    of `graph.cost.timing_grid` and interpolated between them: a search tries many
    micro-batches (TAG on the demo's job: six, 2.5 s of timing each, which took its whole
    budget on a first plan)."""

    def timed(batch: int, runtime: str):
        return measure_train_job(job, batch, use_cache=True, retime=retime, runtime=runtime,
                                 corun=corun if runtime == "module" else 0)

    def train_costs(batch: int, runtime: str = "module"):
        if runtime != "stage":  # one batch per plan: timed exactly
            return timed(batch, runtime)
        # searches try many micro-batches: timed on the grid, interpolated between
        lo, hi = timing_grid(batch)
        at_lo = timed(lo, runtime)
        if lo == hi or at_lo is None:
            return at_lo
        at_hi = timed(hi, runtime)
        return None if at_hi is None else interpolate_train_costs(at_lo, at_hi, lo, hi, batch)
    return train_costs


def lab_corun(ranks: int, cores: int) -> int:
    """Copies of the training step run beside a lab rank's timing (`graph.corun`): the other
    ranks on the lab machine of `cores` cores (`LabProfile.cores`), at most 4 per core (as
    `topotrain.collectives.calibrate` shares them): beyond that the cores only take turns more
    often."""
    return max(0, min(ranks, 4 * cores) - 1)


def _on_lab_cpu(ctx: PlanContext) -> PlanContext:
    """`ctx` with the ranks costed as the lab runs them: every training host a `cpu` on this
    machine, its ranks single-threaded, all sharing its `ctx.lab.cores` cores. A rank's
    ops are timed on this CPU at its batch beside the lab's other ranks (whatever
    `cost.method` says: the roofline's generic CPU is not this one) and the simulator shares
    the cores among the ranks' compute (`Network.cpu_pool`, `lab_pool`). Models whose
    roofline step exceeds `LAB_TIMED_MAX_S` keep the context's costs (the lab does not train
    them, and timing them would take minutes)."""
    dev = ctx.device[ctx.hosts[0]]
    fwd, bwd = totals(roofline_costs(ctx.graph, dev))
    if fwd + bwd > LAB_TIMED_MAX_S:
        return ctx
    measured = ctx.train_costs(ctx.local_batch) if ctx.train_costs else None
    if measured is None:  # the model does not train on real tensors here
        return ctx
    ops, step = rank_op_costs(ctx.graph, measured, ctx.job.cost.scale)
    cal = load_calibration() if ctx.use_cache else None
    rt = runtime_costs(cal)
    return replace(ctx, costs={**ctx.costs, dev.name: ops}, step_s=step,
                   cpu_pool=lab_pool(ctx, lab_messages(ctx, cal)),
                   bucket_copy=(rt.per_piece_s, rt.copy_bytes_per_s))


def lab_pool(ctx: PlanContext, messages: MessageCost | None) -> CpuPool:
    """The lab machine's cores as the simulator shares them (`CpuPool`): every rank's node
    (a host of one rank, else the host's device nodes ``h0/g1``, `sim.devices`, and the host
    node, where a data-parallel strategy computes for all its ranks at once) on
    `ctx.lab.cores` cores, gloo's `messages` charged to every step between two ranks (a
    host's own steps over loopback too). A host of several ranks is one CPU group in the
    lab (`topoctl.lab.cpu.quotas`, its fixed share over all the cluster's hosts): its ranks
    share its quota (`CpuPool.hosts`), each at most one core. A host of one rank is capped
    by its own quota as before (`strategies.host_speeds` gives it). Pure; O(ranks)."""
    # a multi-rank host's node too: data-parallel strategies compute there for all its ranks
    nodes = [h for h in ctx.hosts] + [device_node(h, i) for h in ctx.hosts
                                      if len(ctx.ranks[h]) > 1 for i in range(len(ctx.ranks[h]))]
    shared = [h for h in ctx.hosts if len(ctx.ranks[h]) > 1]
    if not shared:
        return CpuPool(frozenset(nodes), ctx.lab.cores, messages)
    stated = {h.name: h.speed for h in ctx.cluster.hosts}
    devices = {h.name: ctx.cluster.gpus(h.name).count for h in ctx.cluster.hosts}
    q = lab_quotas(stated, ctx.lab.cores, devices)
    return CpuPool(frozenset(nodes), ctx.lab.cores, messages, 0.0,
                   tuple((h, q[h], len(ctx.ranks[h])) for h in shared))


def lab_messages(ctx: PlanContext, cal: dict | None):
    """What a gloo message costs a lab rank's CPU (`sim.network.MessageCost`, charged by the
    simulator to every collective's steps between the lab's ranks): the machine's runtime
    calibration (``python -m topotrain.collectives.calibrate``; its per-message figure
    measured with ranks sharing the cores when the lab has more ranks than cores, its
    one-rank figure otherwise) and the lab's cable emulation per byte
    (`placement.runtime.message_cost`); the defaults without the calibration `cal`."""
    crowded = ctx.world_size > ctx.lab.cores
    return message_cost(runtime_costs(cal), ctx.lab, shared_message_s(cal) if crowded else None)


STEADY_ITERATIONS = 3  # iterations simulated back to back for a steady-state period


def evaluate(ctx: PlanContext, name: str) -> Evaluated:
    """Run strategy `name` and simulate its iteration (its steady-state period when ranks
    leave a collective one by one: ``Collective.member_done``). A strategy's errors become
    the file's they are about: StrategyError -> JobError at `strategies[i]`; RoutingError,
    FabricError, SimError -> ClusterError (the fabric cannot carry the job)."""
    t0 = time.perf_counter()
    try:
        early_memory_check(ctx, name)
        s = resolve(name)(ctx)
        groups = check_memory(ctx, s)
        res = score(ctx, s)
    except StrategyError as e:
        i = ctx.job.strategies.index(name) if name in ctx.job.strategies else 0
        raise JobError([(f"strategies[{i}]", f"{name}: {m}") for _, m in e.problems]) from None
    except RoutingError as e:
        raise ClusterError(e.problems) from None
    except (FabricError, SimError) as e:
        raise ClusterError([("fabric", m) for _, m in e.problems]) from None
    return Evaluated(s, res, time.perf_counter() - t0, groups)


def device_capacity(ctx: PlanContext, host: str) -> float | None:
    """Bytes each of `host`'s devices holds, when known: the cluster's `gpu_types` memory,
    else the built-in device type's datasheet figure; None for a lab `cpu` host (the roofline's
    generic CPU has no memory figure of this machine) or a `gpu_types` entry without one."""
    name = ctx.device[host].name
    declared = ctx.cluster.gpu_types.get(name)
    if declared is not None and declared.memory:
        return float(declared.memory)
    if name == "CPU" or name not in DEVICES:
        return None
    return DEVICES[name].memory


def plan_layout(ctx: PlanContext, s: Strategy) -> list[DeviceGroup]:
    """What each device of strategy `s` holds and does (`layout_of` its collective)."""
    return layout_of(ctx, s.collective)


def layout_of(ctx: PlanContext, collective: dict) -> list[DeviceGroup]:
    """What each device of a plan with `collective` holds (`sim.layout.layout`): the job's ops
    with their bytes at the captured batch, the hosts' devices and their capacities."""
    g = ctx.graph
    ops = [OpBytes(o.name, o.param_bytes, 0 if o.is_view else o.out_bytes) for o in g.ops]
    devices = {h: [h] if len(rs) == 1 else [device_node(h, i) for i in range(len(rs))]
               for h, rs in ctx.ranks.items()}
    return layout(ops, g.batch, g.dtype_bytes, collective, devices, ctx.ranks,
                  {h: ctx.device[h].name for h in ctx.hosts},
                  {h: device_capacity(ctx, h) for h in ctx.hosts})


def check_memory(ctx: PlanContext, s: Strategy) -> list[DeviceGroup]:
    """The layout of strategy `s` (`plan_layout`); StrategyError naming every group of
    devices that cannot hold its part, what each needs by kind and what it has. Every
    strategy's plan passes here (`evaluate`), post-passes included."""
    return check_memory_of(ctx, s.collective)


def early_memory_check(ctx: PlanContext, name: str) -> None:
    """`check_memory` before strategy `name` plans, when its memory is already known: a
    whole-model base (`WHOLE_MODEL_BASES`) without +shares holds the model and its per-rank
    batch's activations on every device whatever it decides, so a model that cannot fit is
    refused in milliseconds instead of after its search (DisCo searched 13B-parameter buckets
    for minutes on a cluster that cannot hold them). The check after planning stays the
    authority for every strategy."""
    base, passes = composition(name)
    if base in WHOLE_MODEL_BASES and "shares" not in passes:
        check_memory_of(ctx, {"algorithm": "data-parallel"})


def check_memory_of(ctx: PlanContext, collective: dict) -> list[DeviceGroup]:
    """The layout of a plan whose collective is `collective` (`plan_layout`); StrategyError
    naming every group of devices that cannot hold its part, what each needs by kind and what
    it has."""
    groups = layout_of(ctx, collective)
    over = overflows(groups)
    if over:
        raise StrategyError("does not fit in device memory: " + "; ".join(over))
    return groups


def iteration_collectives(s: Strategy) -> list[dict]:
    """The collectives and activation transfers of one iteration of `s` with their bytes
    (`sim.layout.collectives` over its tasks)."""
    steps = []
    for t in s.tasks:
        if isinstance(t, Collective):
            sc = t.schedule
            steps.append((sc.name, len(sc.members), sum(st.size for st in sc.steps) * sc.scale))
        elif isinstance(t, Transfer):
            steps.append(("transfer", 2, float(t.size)))
    return collectives(steps)


def score(ctx: PlanContext, s: Strategy) -> SimResult:
    """The simulated iteration of strategy `s` as the planner predicts it: its tasks at the
    hosts' speeds (`host_speeds`; `s.network` takes them), and when ranks leave a collective
    one by one or a task waits for the previous iteration, the steady-state period. Raises
    what the simulator raises (`evaluate` turns it into the files' errors)."""
    speeds = host_speeds(ctx)
    if speeds:  # hosts that differ in compute (`hosts[].speed`); none: as before
        # a device node that computes on its own (a pipeline stage's) runs at its host's
        # speed, which is per device (`host_speeds`), as `lower_bound` counts it
        speeds |= {t.device: speeds[h] for t in s.tasks if isinstance(t, Compute)
                   for h in (split_device(t.device)[0],) if h in speeds and h != t.device}
        s.network = replace(s.network, speed=speeds, _cache={})
    res = simulate(s.tasks, s.network, record=False)
    if overlaps_iterations(s.tasks):
        # the next iteration's compute starts under the communication's tail, and the
        # period is the prediction (`topoctl.sim.steady`)
        period = (s.period if s.period is not None
                  else steady_period(s.tasks, s.network, STEADY_ITERATIONS))
        res = replace(res, iteration_time=period, exposed_comm=max(
            0.0, period - res.compute_time), isolated_iteration=res.iteration_time)
    return res


def lower_bound(ctx: PlanContext, s: Strategy) -> tuple[float, str]:
    """A lower bound on strategy `s`'s iteration that holds for the plan it stands beside:
    max(compute, communication).

    compute: the busiest device's compute tasks in `s.tasks` at its speed (`host_speeds`; a
    device runs one task at a time, a pooled CPU device at most its quota's cores), and on a
    CPU pool all pooled compute over the pool's cores. Taken from the plan's own tasks, so
    batch shares, fusion and pipeline stages are what the plan runs (the data-parallel
    formula over even batches put a `+shares` plan below its bound: its slow host computes
    fewer samples than the even split gives it).

    communication: the bytes each host's ranks send to other hosts in the plan's tasks over
    the host's NIC goodput in the plan's own fabric (`host_traffic_bound`), and for a plan
    that all-reduces the whole gradient over the hosts (ring or trees, no SFB, no pipeline)
    also the AllReduce bound
    2(n-1)/n * S / B over the n hosts, B the largest host NIC goodput (hosts of several
    ranks: the inter-host part of any AllReduce, every host's sum leaves its NICs)."""
    compute, pool_work = _compute_bound(ctx, s)
    egress = _host_egress(s.fabric)
    traffic = host_traffic_bound(s, egress)
    n = len(ctx.hosts)
    comm = traffic
    if _allreduces_gradient(s) and n > 1:
        bw = max((egress.get(h, 0.0) for h in ctx.hosts), default=0.0)
        if bw > 0:
            comm = max(comm, 2 * (n - 1) / n * sum(s.buckets) / bw)
    compute = max(compute, pool_work)
    return max(compute, comm), ("max(compute, 2(n-1)/n*S/B_host, host bytes/B_host): "
                                + ("compute-bound" if compute >= comm else "bandwidth-bound"))


def _allreduces_gradient(s: Strategy) -> bool:
    """Whether `s` all-reduces every gradient byte over the hosts (ring or trees, no SFB)."""
    c = s.collective
    return c.get("algorithm") in ("ring", "trees") and not c.get("sfb")


def _compute_bound(ctx: PlanContext, s: Strategy) -> tuple[float, float]:
    """(busiest device's compute seconds, all pooled compute over the pool's cores, or over
    a shared host quota's cores (`CpuPool.hosts`) when that is more). A device of a host
    whose ranks share one quota computes at most one core or that quota, whichever is less
    (it takes what its idle host-mates leave), not at its per-rank share; a compute task on
    such a host's node stands for its k ranks at once (k times its CPU, at the per-rank
    share)."""
    speeds = host_speeds(ctx)
    pooled = s.network.cpu_pool.devices if s.network.cpu_pool is not None else None
    quotas = pool_host_quotas(s.network.cpu_pool)
    busy: dict[str, float] = {}
    per_quota = dict.fromkeys(quotas, 0.0)
    pool = 0.0
    for t in s.tasks:
        if isinstance(t, Compute) and not t.communication:
            host, _ = split_device(t.device)
            sp = speeds.get(host, speeds.get(t.device, 1.0))
            pooled_dev = pooled is not None and t.device in pooled
            cpu = t.duration
            if pooled_dev and host in quotas:
                q, k = quotas[host]
                if host != t.device:  # one rank: it may use its idle host-mates' share
                    sp = min(1.0, q)
                else:  # all k ranks at once, each at its share (`speeds`)
                    cpu = k * t.duration
                per_quota[host] += cpu
            busy[t.device] = busy.get(t.device, 0.0) + t.duration / sp
            if pooled_dev:
                pool += cpu
    cores = s.network.cpu_pool.cores if s.network.cpu_pool is not None else 1
    hosts = max((w / quotas[h][0] for h, w in per_quota.items() if quotas[h][0] > 0),
                default=0.0)
    return max(busy.values(), default=0.0), max(pool / max(1, cores), hosts)


def _host_egress(fabric: FabricGraph) -> dict[str, float]:
    """Each node's total link goodput in bytes/s in the plan's `fabric` (every link it ends,
    one direction; a re-cabled fabric's own, as `topoopt` plans it)."""
    egress: dict[str, float] = {}
    eff = tcp_efficiency(fabric.mtu)
    for ln in fabric.links:
        for end in (ln.a, ln.b):
            egress[end] = egress.get(end, 0.0) + eff * ln.capacity / 8
    return egress


def host_traffic_bound(s: Strategy, egress: dict[str, float]) -> float:
    """The most seconds any host's NICs need for the bytes the plan's tasks send from it to
    other hosts (collective steps and transfers; a device's bytes count for its host), at the
    host's total NIC goodput `egress`. Holds for any plan: every such byte leaves the host
    through its NICs. O(steps)."""
    sent: dict[str, float] = {}
    for t in s.tasks:
        if isinstance(t, Collective):
            sc = t.schedule.scale
            for st in t.schedule.steps:
                a, b = split_device(st.src)[0], split_device(st.dst)[0]
                if a != b:
                    sent[a] = sent.get(a, 0.0) + st.size * sc
        elif isinstance(t, Transfer):
            a, b = split_device(t.src)[0], split_device(t.dst)[0]
            if a != b:
                sent[a] = sent.get(a, 0.0) + t.size
    return max((b / egress[h] for h, b in sent.items() if egress.get(h, 0.0) > 0),
               default=0.0)


def make_plan(cluster: Cluster, job: Job, use_cache: bool = True, retime: bool = False,
              lab: LabProfile | None = None, progress: Callable[[str], None] | None = None
              ) -> tuple[dict, PlanContext, list[Evaluated]]:
    """The full pipeline; returns (plan document, context, all evaluated strategies). `lab`:
    as `prepare`. `progress`: told of each step as it starts (the model's capture, every
    timing on this CPU, each strategy), for a caller that shows progress."""
    say = progress or (lambda msg: None)
    # one capture child serves the whole call: graph, op times, every strategy's timings
    with reporting(progress), capture_session():
        say(f"capturing {job.model.catalog or job.model.factory}")
        ctx = prepare(cluster, job, use_cache, retime, lab)
        evals, refused = evaluate_all(ctx, say)
    best = min(evals, key=lambda e: e.result.iteration_time)
    doc = render(ctx, best, evals)
    if refused:
        doc["metadata"]["refused"] = {name: msg for name, msg in refused}
    return doc, ctx, evals


def evaluate_all(ctx: PlanContext, say: Callable[[str], None] | None = None
                 ) -> tuple[list[Evaluated], list[tuple[str, str]]]:
    """Every strategy of the job scored (`evaluate`), and the ones that cannot plan this job:
    (name, "what stops it (file YAML path)") in the job's order. One strategy that refuses
    raises its own error as before; when every one of several refuses, one JobError lists
    them all at their `strategies[i]`, each saying what stops it and where, instead of the
    first alone (a user fixed and re-ran five times). `say`: told of each strategy as it
    starts."""
    evals: list[Evaluated] = []
    refused: list[tuple[int, str, str]] = []
    for i, name in enumerate(ctx.job.strategies):
        if say is not None:
            say(f"planning strategy {name}")
        try:
            evals.append(evaluate(ctx, name))
        except (JobError, ClusterError) as e:
            if len(ctx.job.strategies) == 1:
                raise
            refused.append((i, name, refusal_message(name, e)))
    if not evals:
        raise JobError([(f"strategies[{i}]", msg) for i, _, msg in refused])
    return evals, [(name, msg) for _, name, msg in refused]


def refusal_message(name: str, err: JobError | ClusterError) -> str:
    """One refusal in the one style: ``NAME: what stops it (FILE PATH)``: the strategy, its
    reasons (the strategy's own prefix dropped), and the YAML path each is at, in the job
    file or the cluster file."""
    where = "cluster" if isinstance(err, ClusterError) else "job"
    parts = []
    for path, msg in err.problems:
        text = str(msg).removeprefix(f"{name}: ").removeprefix(f"strategy {name}: ")
        text = text.removeprefix(f"strategy {name} ")
        parts.append(text if path.startswith("strategies[") and where == "job"
                     else f"{text} ({where} {path})")
    return f"{name}: " + "; ".join(parts)


def render(ctx: PlanContext, best: Evaluated, evals: list[Evaluated]) -> dict:
    """The plan document for the `best` strategy (addresses, HostStates, cabling, launch spec,
    prediction and bound); ClusterError when addresses do not fit."""
    s, res = best.strategy, best.result
    try:
        addr = assign_cluster(s.fabric, ctx.cluster.addressing)
        hosts = render_hosts(s.fabric, s.hops, addr, s.routes, s.rates)
        for h, sections in s.extra.items():
            for key, items in sections.items():
                if isinstance(items, dict):  # e.g. sysctl: merged key by key
                    hosts[h][key] = hosts[h].get(key, {}) | items
                else:
                    hosts[h][key] = hosts[h].get(key, []) + list(items)
        for h in hosts:  # hosts marked `ovs: true` enforce their part through Open vSwitch
            if ctx.cluster.runs_ovs(h):
                hosts[h] = ovs_host(hosts[h])
    except AddressingError as e:
        raise ClusterError(e.problems) from None
    bound, bound_name = lower_bound(ctx, s)
    it = res.iteration_time
    meta = {
        "cluster": ctx.cluster.name, "job": ctx.job.name, "strategy": s.name,
        "strategies": {e.strategy.name: {"iteration_time": _r(e.result.iteration_time)}
                       for e in evals},
        "prediction": {k: _r(v) for k, v in res.breakdown().items()}
        | {"busiest_links": {k: _r(u) for k, u in sorted(
            res.link_utilisation.items(), key=lambda kv: (-kv[1], kv[0]))[:5] if u > 0},
           "samples_per_second": _r(ctx.job.batch.global_ / it) if it > 0 else 0.0,
           "cost_model": sorted({_cost_model(ctx, h) + ":" + ctx.device[h].name
                                 for h in ctx.hosts})},
        **({"inventory": _inventory(ctx.cluster)} if ctx.cluster.inventory else {}),
        # what the strategy reports about its collective (trees: rate, optimum, bound name,
        # achieved/optimal), so every plan states how close to the optimum it is
        **({"collective": {k: _r(v) if isinstance(v, float) else v
                           for k, v in s.notes.items()}} if s.notes else {}),
        "bound": {"name": bound_name, "iteration_time": _r(bound),
                  "ratio": _r(it / bound) if bound > 0 else None},
        "model": {"name": ctx.graph.model, "parameters_bytes": ctx.graph.param_bytes,
                  "flops_per_rank_fwd": ctx.graph.flops, "ops": len(ctx.graph.ops)},
        # per device group: degrees, memory against capacity (the figures the check used),
        # and the iteration's collectives
        "layout": layout_doc(best.layout or plan_layout(ctx, s), iteration_collectives(s)),
        "addressing": addr.summary(),
    }
    job = launch_spec(ctx.job, ctx.hosts, ctx.ranks, addr, ctx.local_batch, s.collective,
                      s.buckets, s.bucket_cap)
    return plan_document(meta, fabric_wiring(ctx.cluster, s.fabric), hosts, job)


def _cost_model(ctx: PlanContext, h: str) -> str:
    """`timed` (lab ranks timed on this CPU, `_on_lab_cpu`), `measured` (per-op profile on this
    CPU, `cost.method`) or `roofline`."""
    if ctx.cpu_pool is not None:
        return "timed"
    return "measured" if _measured(ctx, h) else "roofline"


def _measured(ctx: PlanContext, h: str) -> bool:
    t = ctx.job.cost.device or ctx.cluster.gpus(h).type
    m = ctx.job.cost.method
    return m == "measured" or (m == "auto" and t == "cpu")


def _r(x: float) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.6g}")


def _inventory(cluster: Cluster) -> dict:
    """The cluster's inventory with each host's address: how apply reaches the hosts."""
    return cluster.inventory_doc()
