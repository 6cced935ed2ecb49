"""Planner strategies ``placement`` and ``pipeline``: the model split into pipeline stages over
the hosts, optionally each stage data-parallel over a group of hosts (hybrid).

``placement`` (the thesis's pipeline): coarsen the op graph (`graph.coarsen.coarsen_graph`:
fusion + co-location groups, thresholds from the cost distribution), then place the coarse
graph on the stage groups (`placement.search.candidates`): HEFT, the contiguous partition and
one device, each simulated as the plan would run (below), the fastest kept (`search: auto`);
`search: milp` adds the exact MILP (HiGHS, warm start from the best candidate, deterministic
node limit, `placement.improve`). ``pipeline`` is the baseline: the
balanced contiguous partition (`placement.partition`) of the same coarse graph, as
GPipe/PipeDream-style tools split a model.

Candidates: every g dividing the host count with H/g >= 2 stage groups of g consecutive hosts
(g = 1: a pure pipeline; g > 1: hybrid, replica r of stage s talks to replica r of stage
s + 1). Each is scored by the simulator: per replica, a GPipe iteration of `microbatches`
micro-batches (every forward, then every backward in reverse, one compute stream per host),
activations and their gradients crossing consecutive stages as flows on the fabric, then the
stage's gradient sync over its group and the optimiser step. Each replicated stage's sync
(gloo's ring, a parameter server on one of its hosts, or packed trees over the stage's own
cables with the tree runtime's per-member CPU; `none` for one replica) is chosen by
simulating every option alone on the plan's network (`placement.stagesync.choose_sync`) and
stated per stage in the plan (`topocontract.stages`). `search_shape` plans a fixed shape
whose stages may have unequal replica counts (each replica a share of every micro-batch's
rows). The fastest candidate is returned.
Stages are the placement's devices in the order of the acyclic graph between them; values
produced before a boundary and read after it cross it (the runtime, `topotrain.pipeline`,
forwards them stage by stage), which is what the simulator charges.

Bad input: a model that fits on no device, fewer hosts than the memory needs, a batch that
does not split into micro-batches: `JobError` naming the cause; nothing is written.
O(candidates * (search + simulation)).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import networkx as nx

from topocontract.schedule import TreeSchedule
from topocontract.stages import pieces
from topoctl.collective.trees.pipeline import RuntimeCosts, runtime_costs
from topoctl.fabric.graph import connection_links
from topoctl.graph.coarsen import CoarseGraph, coarsen_graph, from_opgraph
from topoctl.graph.cost import TrainCost, timing_grid
from topoctl.labprofile import LabProfile
from topoctl.placement import heft, partition
from topoctl.placement.build import build_problem, node_memory, route_matrix
from topoctl.placement.problem import Placement, PlacementError, PlacementProblem, serial
from topoctl.placement.runtime import (
    allreduce_cpu,
    message_cpu,
    ps_cpu,
    shared_message_s,
    stage_costs,
)
from topoctl.placement.search import candidates
from topoctl.placement.stagesync import choose_sync, stage_trees, sync_schedule, tree_cpu
from topoctl.sim.engine import simulate
from topoctl.sim.fabric import network_from_fabric, tcp_efficiency
from topoctl.sim.network import CpuPool, Network
from topoctl.sim.routing import shortest_next_hops
from topoctl.sim.tasks import Collective, Compute, Task, Transfer, sent
from topoctl.spec.job import JobError
from topoctl.strategies import PlanContext, Strategy, StrategyError
from topoctl.strategies.devices import rank_count_refusal
from topotrain.timing import load_calibration

MILP_NODE_LIMIT = 10  # deterministic; the gap is reported in the plan


@dataclass
class Candidate:
    """One scored pipeline candidate: stage groups, the placement, ops per stage and the simulated
    strategy."""

    groups: list[list[str]]
    placement: Placement
    stages: list[list[str]]  # fx op names per stage, in stage order
    stage_groups: list[list[str]]  # hosts per stage
    strategy: Strategy
    iteration_time: float
    syncs: list[dict]  # per stage (topocontract.stages)
    sync_times: list[dict[str, float]]  # per stage: each sync option's simulated seconds


def stage_order(p: PlacementProblem, assign: list[int]) -> list[int] | None:
    """Devices in use, in the topological order of the graph between them (None: cyclic)."""
    dg = nx.DiGraph()
    dg.add_nodes_from(sorted(set(assign)))
    dg.add_edges_from({(assign[i], assign[j]) for i, j in p.edges if assign[i] != assign[j]})
    try:
        return list(nx.lexicographical_topological_sort(
            dg, key=lambda d: min(i for i, a in enumerate(assign) if a == d)))
    except nx.NetworkXUnfeasible:
        return None


def cut_bytes(ctx: PlanContext, stage_of: dict[str, int], nstages: int, scale: float
              ) -> list[float]:
    """Bytes crossing the boundary after each stage (all values live across it)."""
    last = {o.name: stage_of[o.name] for o in ctx.graph.ops}
    for o in ctx.graph.ops:
        for i in o.inputs:
            if i in last:
                last[i] = max(last[i], stage_of[o.name])
    out = [0.0] * max(0, nstages - 1)
    for o in ctx.graph.ops:
        for s in range(stage_of[o.name], last[o.name]):
            out[s] += o.out_bytes * scale
    return out


def cut_values(ctx: PlanContext, stage_of: dict[str, int], nstages: int) -> list[int]:
    """Values (tensors sent as one message each) crossing the boundary after each stage."""
    last = {o.name: stage_of[o.name] for o in ctx.graph.ops}
    for o in ctx.graph.ops:
        for i in o.inputs:
            if i in last:
                last[i] = max(last[i], stage_of[o.name])
    out = [0] * max(0, nstages - 1)
    for o in ctx.graph.ops:
        for s in range(stage_of[o.name], last[o.name]):
            out[s] += 1
    return out


@dataclass(frozen=True)
class Measured:
    """What the pipeline costs on this machine's CPU (lab hosts): per-op training costs timed at
    the micro-batch (`graph.cost.TrainCost`) and the runtime's calibrated CPU costs per message
    (`placement.runtime`); `lab`: the lab machine every rank runs on (its cores shared, its
    cable emulation's cost per byte), None for ranks on machines of their own."""

    ops: dict[str, TrainCost]
    runtime: RuntimeCosts
    per_message_shared_s: float | None = None
    lab: LabProfile | None = None
    # CPU seconds a rank spends drawing the iteration's global batch (`topotrain.pipeline`
    # draws it on every rank), and the cores' crowding (`sim.network.CpuPool.crowding`)
    inputs_s: float = 0.0
    crowding: float = 0.0


def default_sync(group: list[str]) -> dict:
    """A stage's sync when none was chosen: gloo's ring over several replicas, else none."""
    return {"kind": "ring"} if len(group) > 1 else {"kind": "none"}


def sync_cpu(measured: Measured | None):
    """The CPU one replica spends in its stage's sync, `placement.stagesync.CpuCost`; None
    without measured runtime costs (the roofline: the network part only)."""
    if measured is None:
        return None

    def cpu(kind: str, nbytes: float, members: int, server: bool) -> float:
        args = (measured.runtime, measured.lab, measured.per_message_shared_s)
        if kind == "ps":
            return ps_cpu(nbytes, members, server, *args)
        return allreduce_cpu(nbytes, members, *args) if kind == "ring" else 0.0

    return cpu


def grad_bytes(ctx: PlanContext, stages: list[list[str]]) -> list[int]:
    """Gradient bytes of each stage (its ops' parameters)."""
    ops = ctx.graph.by_name()
    return [sum(ops[o].param_bytes for o in st) for st in stages]


def trees_cpu_model(ctx: PlanContext, measured: Measured | None):
    """The tree runtime's CPU per member of a stage (`placement.stagesync.tree_cpu`): the
    measured runtime costs and the lab machine with `measured`, else the machine's calibration
    (or the defaults) on machines of their own, as the whole-cluster `trees` strategy
    models it."""
    if measured is not None:
        return measured.runtime, measured.lab
    return runtime_costs(load_calibration() if ctx.use_cache else None), None


def choose_syncs(ctx: PlanContext, stages: list[list[str]], groups: list[list[str]],
                 network: Network, measured: Measured | None
                 ) -> tuple[list[dict], list[dict[str, float]]]:
    """Per stage the fastest sync of its replicas by simulation on `network`
    (`placement.stagesync.choose_sync`: ring, a server on each member, and packed trees over
    the stage's own cables, `stage_trees`, with their CPU model) and every option's seconds."""
    cpu = sync_cpu(measured)
    costs, lab = trees_cpu_model(ctx, measured)
    links = [(ln.a, ln.b, ln.capacity / 8.0) for ln in connection_links(ctx.fabric)]
    eff = tcp_efficiency(ctx.fabric.mtu)
    picked = []
    for grp, b in zip(groups, grad_bytes(ctx, stages), strict=True):
        trees = stage_trees(links, grp, float(b), costs, lab, eff)
        picked.append(choose_sync(network, grp, float(b), cpu, trees, tree_cpu(costs, lab)))
    return [p[0] for p in picked], [p[1] for p in picked]


def pipeline_tasks(ctx: PlanContext, stages: list[list[str]], groups: list[list[str]],
                   micro: int, scale: float, measured: Measured | None = None,
                   syncs: list[dict] | None = None, shares: list[list[int]] | None = None,
                   measured_at: Mapping[int, Measured] | None = None
                   ) -> tuple[list[Task], list[int]]:
    """One GPipe iteration per replica, then per-stage gradient sync and step (module
    docstring); `syncs`: each stage's (`topocontract.stages`; default: `default_sync`).
    With `measured`: stage compute from ops timed at the micro-batch (`placement.runtime`),
    every rank's tasks in its program's order (the runtime is one thread: receive, forward,
    send per micro-batch, then the backwards in reverse), every message's CPU cost on the
    sending and the receiving rank, sends blocking as gloo's do (`move`), the replicas' CPU
    for their gradient AllReduce after its network part; simulate it on
    `lab_network` so that the lab's ranks share the machine's cores.

    Stages of unequal replica counts (`shares`: rows of each micro-batch per replica, per
    stage, `topocontract.stages`): `scale` is then that of one row, `measured_at[rows]` the
    costs timed at each replica's rows, and each boundary moves the row pieces the runtime
    sends (`topocontract.stages.pieces`), a message per value and piece. Without `shares`
    every stage has the same replicas and each takes the micro-batch `scale` describes.
    Returns (tasks, gradient bytes per stage)."""
    if shares is None:  # the equal-count plan: one "row" = a replica's micro-batch
        shares, measured_at = [[1] * len(grp) for grp in groups], {1: measured}
    base = next(iter((measured_at or {}).values()), None)
    stage_of = {op: s for s, ops in enumerate(stages) for op in ops}
    cut = cut_bytes(ctx, stage_of, len(stages), scale)  # bytes per row
    nmsg = cut_values(ctx, stage_of, len(stages))
    grads = grad_bytes(ctx, stages)
    k = len(stages)
    syncs = syncs or [default_sync(grp) for grp in groups]
    cpu = sync_cpu(base)
    per_stage = ({rows: [tuple(ctx.job.cost.scale * x for x in
                               stage_costs(ctx.graph, stage_of, s, m.ops)) for s in range(k)]
                  for rows, m in measured_at.items()} if base else None)

    def cost(s: int, j: int, part: int) -> float:  # part 0: forward, 1: backward
        rows, h = shares[s][j], groups[s][j]
        if per_stage:
            return per_stage[rows][s][part]
        c = ctx.host_costs(h)
        return scale * rows * sum((c[o].fwd, c[o].bwd)[part] for o in stages[s])

    def msg(b: int, rows: int) -> float:  # CPU of one piece's messages at one end
        if not base or not nmsg[b]:
            return 0.0
        return nmsg[b] * message_cpu(cut[b] * rows / nmsg[b], base.runtime, base.lab,
                                     base.per_message_shared_s)

    tasks: list[Task] = []
    last: dict[str, str] = {}  # measured: each rank runs its program in order (GPipe)

    def compute(tid: str, h: str, seconds: float, deps: tuple[str, ...],
                runtime: bool = False) -> str:
        """`runtime`: a runtime's own CPU (messages, the sync), `Compute.communication`."""
        if base and h in last:
            deps = (last[h],) + deps
        tasks.append(Compute(tid, h, seconds, deps, communication=runtime))
        last[h] = tid
        return tid

    def move(tid: str, src: str, dst: str, b: int, rows: int, after: str) -> str:
        """Transfer `tid` of `rows` rows across boundary b after `after`, the sender's CPU for
        it, then the receiver's; the id the receiver's next compute waits for. Measured:
        gloo's send is a rendezvous (its bytes go when the receiving rank has posted its
        receive, i.e. finished what its program does before: gloo's tcp ``Pair::send``
        notifies the peer and waits for its ``NOTIFY_RECV_READY``), and returns when its
        bytes are written to the socket; on the lab machine (``Measured.lab``) the socket
        takes up to ``LabProfile.send_buffer_bytes`` of them, so the sender goes on when
        the rest has left (`sim.tasks.sent`), the receiver when the last byte arrived.
        Elsewhere the sender waits for the delivery."""
        ready = (after,) + ((last[dst],) if base and dst in last else ())
        buf = base.lab.send_buffer_bytes if base and base.lab is not None else None
        tasks.append(Transfer(tid, src, dst, cut[b] * rows, ready, buffer=buf))
        if not msg(b, rows):
            return tid
        compute(f"{tid}/tx", src, msg(b, rows), (tid if buf is None else sent(tid),), True)
        return compute(f"{tid}/rx", dst, msg(b, rows), (tid,), True)

    links = [pieces(shares[b], shares[b + 1]) for b in range(k - 1)]
    if base and base.inputs_s > 0:  # every rank draws the iteration's global batch first
        for s in range(k):
            for j, h in enumerate(groups[s]):
                compute(f"in{s}.{j}", h, base.inputs_s, ())
    for m in range(micro):
        for s in range(k):
            for j, h in enumerate(groups[s]):
                deps = tuple(move(f"act{s - 1}.{m}.{a}.{j}", groups[s - 1][a], h, s - 1,
                                  hi - lo, f"F{s - 1}.{m}.{a}")
                             for a, i, lo, hi in links[s - 1] if i == j) if s else ()
                compute(f"F{s}.{m}.{j}", h, cost(s, j, 0), deps)
    for m in reversed(range(micro)):
        for s in reversed(range(k)):
            for j, h in enumerate(groups[s]):
                deps = (f"F{s}.{m}.{j}",) + (tuple(
                    move(f"grad{s}.{m}.{i}.{j}", groups[s + 1][i], h, s, hi - lo,
                         f"B{s + 1}.{m}.{i}")
                    for a, i, lo, hi in links[s] if a == j) if s + 1 < k else ())
                compute(f"B{s}.{m}.{j}", h, cost(s, j, 1), deps)
    tcpu = tree_cpu(*trees_cpu_model(ctx, base))
    for s in range(k):
        done = tuple(f"B{s}.{m}.{j}" for m in range(micro) for j in range(len(groups[s])))
        sched = sync_schedule(groups[s], syncs[s], float(grads[s]))
        trees = sched is not None and syncs[s]["kind"] == "trees"
        if trees:  # the tree runtime's CPU runs while its chunks travel (`stagesync`)
            for j, sec in enumerate(tcpu(TreeSchedule.model_validate(syncs[s]["schedule"]),
                                         float(grads[s]))):
                compute(f"ar{s}/cpu.{j}", groups[s][j], sec, done, True)
        if sched is not None:
            tasks.append(Collective(f"ar{s}", sched, done))
            done = (f"ar{s}",)
        for j, h in enumerate(groups[s]):
            if trees:
                done = (f"ar{s}", f"ar{s}/cpu.{j}")
            elif cpu and sched is not None:  # the replicas' CPU for it, then the step
                server = syncs[s]["kind"] == "ps" and syncs[s]["server"] == h
                compute(f"ar{s}/cpu.{j}", h, cpu(syncs[s]["kind"], float(grads[s]),
                                                  len(groups[s]), server), done, True)
            d = ctx.device[h]
            step = (per_stage[shares[s][j]][s][2] if per_stage else
                    ctx.job.cost.scale * (d.launch + 4 * grads[s] / (d.mem_bw * d.efficiency)))
            compute(f"step{s}.{j}", h, step, done)
    if base and len(groups[-1]) > 1:  # the last stage's replicas all-reduce the loss (gloo)
        sec = allreduce_cpu(4.0, len(groups[-1]), base.runtime, base.lab,
                            base.per_message_shared_s)
        for j, h in enumerate(groups[-1]):
            compute(f"loss.{j}", h, sec, (f"step{k - 1}.{j}",), True)
    return tasks, grads


def lab_network(network: Network, hosts: list[str], measured: Measured | None,
                mtu: int) -> Network:
    """`network` as the lab runs it when `measured` says every rank runs on this machine:
    the hosts' compute on the lab machine's shared cores (processor sharing,
    `Network.cpu_pool`), and every link with the token credit the lab shapes a cable of its
    line rate with (`Link.credit`, ``LabProfile.cable_credit_s`` at frames of `mtu` bytes;
    the links' capacities are goodput, `sim.fabric.tcp_efficiency`): a message that starts
    on a cable that idled passes its first bytes at once (measured,
    bench/results/lab-cable-credit-2026-11-28.txt)."""
    if not measured or measured.lab is None:
        return network
    lab, eff = measured.lab, tcp_efficiency(mtu)
    links = {k: replace(ln, credit=lab.cable_credit_s(ln.capacity * 8.0 / eff, mtu)
                        * ln.capacity) for k, ln in network.links.items()}
    return replace(network, links=links, _cache={},
                   cpu_pool=CpuPool(frozenset(hosts), lab.cores, None, measured.crowding))


def _search(p: PlacementProblem, method: str) -> list[Placement]:
    """The placements to simulate: `partition`: the contiguous baseline; `heuristic`: HEFT,
    partition or one device, the best by the objective; `auto`: all three
    (`placement.search.candidates`; the objective misjudges placements that do not pipeline,
    the simulator decides); `milp`: those plus the MILP warm-started from the best of them
    (`placement.improve`)."""
    if method == "partition":
        return [partition.place(p)]
    if method == "heuristic":
        return [heft.place(p)]
    cands, _ = candidates(p, milp=method == "milp", node_limit=MILP_NODE_LIMIT)
    return cands


def _capacity(ctx: PlanContext) -> dict[str, float]:
    return {h: ctx.device[h].memory for h in ctx.hosts}


def _coarse(ctx: PlanContext) -> tuple[CoarseGraph, dict]:
    ref = ctx.host_costs(ctx.hosts[0])
    fine = from_opgraph(ctx.graph, ref)
    hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
    bw, _ = route_matrix(network_from_fabric(ctx.fabric, hops), ctx.hosts)
    slowest = min(bw.values(), default=1e9)
    coarse, stats = coarsen_graph(fine, slowest)
    return coarse, stats.to_dict()


def search(ctx: PlanContext, method: str, name: str, replicas: int | None = None,
           split: bool = False, sync: str | None = None) -> Strategy:
    """All candidates (module docstring), the fastest as a Strategy. For lab checks of one
    shape (`bench/placement/hybrid_lab_check.py`): `replicas` keeps only that group size,
    `split` drops the no-split candidate, `sync="ring"` states today's ring on every
    replicated stage instead of choosing by simulation; the planner's strategies use none of
    them."""
    hosts = list(ctx.hosts)
    if ctx.world_size != len(hosts):
        # stages over devices (issue 51, item 3) are not planned yet: a stage is a host
        raise StrategyError(rank_count_refusal(
            ctx, f"pipeline stages are whole hosts of one rank; the job has {ctx.world_size} "
                 f"ranks on {len(hosts)} hosts"))
    if len(hosts) < 2:
        raise JobError([("hosts", f"strategy {name}: a pipeline needs at least 2 hosts, the "
                                  f"job has {len(hosts)}")])
    micro = ctx.job.parallelism.microbatches
    coarse, cstats = _coarse(ctx)
    hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
    network = network_from_fabric(ctx.fabric, hops)
    op_cost = {h: {o: c.fwd + c.bwd for o, c in ctx.host_costs(h).items()} for h in hosts}
    cap = _capacity(ctx)
    global_batch = ctx.job.batch.global_
    cands: list[Candidate] = []
    errors: list[str] = []
    for g in [d for d in range(1, len(hosts) // 2 + 1) if len(hosts) % d == 0
              and replicas in (None, d)]:
        if global_batch % (g * micro):
            errors.append(f"{len(hosts) // g} stages x {g} replicas: batch.global "
                          f"{global_batch} does not split into {g} x {micro} micro-batches")
            continue
        groups = [hosts[i:i + g] for i in range(0, len(hosts), g)]
        scale = global_batch / (g * micro) / ctx.local_batch
        meas = measured_stage_costs(ctx, global_batch // (g * micro))
        if meas:  # timed at this candidate's micro-batch: no scaling
            mc = {o: c.fwd + c.bwd_inputs for o, c in meas.ops.items()}
            p = build_problem(coarse, groups, dict.fromkeys(hosts, mc), cap, network, micro,
                              scale, cost_scale=ctx.job.cost.scale)
        else:
            p = build_problem(coarse, groups, op_cost, cap, network, micro, scale)
        try:
            tries = _search(p, method)
        except PlacementError as e:
            errors.append(str(e))
            continue
        one = serial(p)  # no split at all: the simulator decides whether the split pays
        if not split and one is not None and all(t.assign != one.assign for t in tries):
            tries.append(one)
        found: list[Candidate] = []
        for pl in tries:
            order = stage_order(p, pl.assign)
            if order is None:  # stages must form a chain for the runtime: fall back to contiguous
                pl = partition.place(p)
                order = stage_order(p, pl.assign)
            stages = [sorted((o for i, a in enumerate(pl.assign) if a == d
                              for o in coarse.nodes[p.nodes[i]].ops), key=_fx_pos(ctx))
                      for d in order]
            sgroups = [groups[d] for d in order]
            net = lab_network(network, hosts, meas, ctx.fabric.mtu)
            syncs, sync_times = (([default_sync(grp) for grp in sgroups], [{}] * len(sgroups))
                                 if sync == "ring" else
                                 choose_syncs(ctx, stages, sgroups, net, meas))
            strat, t = _scored(ctx, name, stages, sgroups, syncs, micro, scale, meas, net, hops)
            found.append(Candidate(groups, pl, stages, sgroups, strat, t, syncs, sync_times))
        # the fastest; on ties a split before no split, then the better objective
        cands.append(min(found, key=lambda c: (c.iteration_time, len(c.stages) == 1)))
    if not cands:
        raise JobError([("model", f"strategy {name}: no pipeline fits: " + "; ".join(
            dict.fromkeys(errors)) + _min_devices_hint(ctx, coarse, cap, micro))]) from None
    best = min(cands, key=lambda c: (c.iteration_time, len(c.groups[0])))
    s = best.strategy
    stage_of = {op: i for i, ops in enumerate(best.stages) for op in ops}
    g = len(best.stage_groups[0])
    scale = global_batch / (g * micro) / ctx.local_batch
    cut = cut_bytes(ctx, stage_of, len(best.stages), scale)
    s.collective = {
        "algorithm": "pipeline", "schedule": "gpipe", "microbatches": micro,
        "micro_batch": global_batch // (g * micro), "replicas": g,
        "stages": [{"hosts": list(grp), "ranks": [ctx.ranks[h][0] for h in grp],
                    "ops": list(ops), "send_bytes": int(cut[i]) if i < len(cut) else 0,
                    "sync": best.syncs[i]}
                   for i, (grp, ops) in enumerate(zip(best.stage_groups, best.stages,
                                                       strict=True))]}
    s.notes = {"search": best.placement.algorithm, "gap": best.placement.gap,
               "stages": len(best.stages), "replicas": g,
               "objective_s": best.placement.objective,
               "coarsening": cstats,
               "sync": [{"kind": sy["kind"], **({"server": sy["server"]} if "server" in sy
                                                 else {}), "options_s": t}
                        for sy, t in zip(best.syncs, best.sync_times, strict=True)],
               "candidates": {
                   f"{len(c.groups)}x{len(c.groups[0])}": c.iteration_time for c in cands}}
    meas = measured_stage_costs(ctx, global_batch // (g * micro))
    if meas is not None:  # what the lab prediction rests on (docs/placement.md)
        s.notes["compute"] = {"cost": "measured on this CPU at the micro-batch",
                              "micro_batch": global_batch // (g * micro),
                              "threads": ctx.job.launch.threads,
                              "runtime_cpu": meas.runtime.source if meas else None,
                              "inputs_s": meas.inputs_s, "crowding": meas.crowding}
    return s


def even_shares(rows: int, replicas: int) -> list[int]:
    """`rows` split over `replicas` as evenly as integers go, the first replicas one more."""
    q, extra = divmod(rows, replicas)
    return [q + (1 if j < extra else 0) for j in range(replicas)]


def search_shape(ctx: PlanContext, shape: list[int], name: str, sync: str | None = None
                 ) -> Strategy:
    """A pipeline of a fixed shape: stage s on the next `shape[s]` hosts in the cluster's
    order, replica counts that may differ (`topocontract.stages`: each replica takes an even
    share of every micro-batch's rows), the model cut into len(shape) contiguous stages
    balanced for those shares (`placement.partition.place_exactly`), each stage's sync chosen
    by simulation (`sync="ring"`: the ring on every replicated stage). For lab checks of a
    shape (`bench/placement/hybrid_lab_check.py --shape`) and as the plan shape other searches
    can state; the planner's strategies do not call it. JobError when the shape does not fit."""
    hosts, micro = list(ctx.hosts), ctx.job.parallelism.microbatches
    if len(shape) < 2 or min(shape) < 1 or sum(shape) > len(hosts):
        raise JobError([("hosts", f"strategy {name}: shape {shape} needs at least 2 stages "
                                  f"and {sum(shape)} hosts, the job has {len(hosts)}")])
    total = ctx.job.batch.global_ // micro  # rows of one micro-batch
    if total * micro != ctx.job.batch.global_ or total < max(shape):
        raise JobError([("batch.global", f"strategy {name}: {ctx.job.batch.global_} does not "
                                         f"split into {micro} micro-batches of at least "
                                         f"{max(shape)} rows")])
    starts = [sum(shape[:i]) for i in range(len(shape))]
    groups = [hosts[a:a + n] for a, n in zip(starts, shape, strict=True)]
    shares = [even_shares(total, n) for n in shape]
    coarse, cstats = _coarse(ctx)
    hops = shortest_next_hops(ctx.fabric, required=hosts[:sum(shape)])
    network = network_from_fabric(ctx.fabric, hops)
    # the partition balances a stage's replicas at their rows: a group's costs / its size
    op_cost = {h: {o: (c.fwd + c.bwd) / len(grp) for o, c in ctx.host_costs(h).items()}
               for grp in groups for h in grp}
    p = build_problem(coarse, [grp[:1] for grp in groups], op_cost, _capacity(ctx), network,
                      micro, total / ctx.local_batch)
    try:
        pl = partition.place_exactly(p, len(shape))
    except PlacementError as e:
        raise JobError([("model", f"strategy {name}: {e}")]) from None
    stages = [sorted((o for i, a in enumerate(pl.assign) if a == d
                      for o in coarse.nodes[p.nodes[i]].ops), key=_fx_pos(ctx))
              for d in range(len(shape))]
    rows = sorted({x for sh in shares for x in sh})
    measured_at = {r: measured_stage_costs(ctx, r) for r in rows}
    meas = None if any(m is None for m in measured_at.values()) else measured_at[rows[0]]
    net = lab_network(network, [h for grp in groups for h in grp], meas, ctx.fabric.mtu)
    syncs, sync_times = (([default_sync(grp) for grp in groups], [{}] * len(groups))
                         if sync == "ring" else choose_syncs(ctx, stages, groups, net, meas))
    tasks, grads = pipeline_tasks(ctx, stages, groups, micro, 1.0 / ctx.local_batch, meas,
                                  syncs, shares, measured_at if meas else None)
    t = simulate(tasks, net, record=False).iteration_time
    strat = Strategy(name=name, fabric=ctx.fabric, hops=hops, network=net, tasks=tasks,
                     collective={}, buckets=[b for b in grads if b])
    stage_of = {op: i for i, ops in enumerate(stages) for op in ops}
    # send_bytes: what `micro_batch` rows send, as in equal-count plans (render.pipeline)
    cut = cut_bytes(ctx, stage_of, len(stages), shares[0][0] / ctx.local_batch)
    strat.collective = {
        "algorithm": "pipeline", "schedule": "gpipe", "microbatches": micro,
        "micro_batch": shares[0][0], "replicas": max(shape),
        "stages": [{"hosts": list(grp), "ranks": [ctx.ranks[h][0] for h in grp],
                    "ops": list(ops), "shares": shares[i],
                    "send_bytes": int(cut[i]) if i < len(cut) else 0, "sync": syncs[i]}
                   for i, (grp, ops) in enumerate(zip(groups, stages, strict=True))]}
    strat.notes = {"search": pl.algorithm, "stages": len(stages), "replicas": list(shape),
                   "coarsening": cstats, "iteration_s": t,
                   "sync": [{"kind": sy["kind"], **({"server": sy["server"]} if "server" in sy
                                                     else {}), "options_s": o}
                            for sy, o in zip(syncs, sync_times, strict=True)]}
    return strat


def _scored(ctx: PlanContext, name: str, stages: list[list[str]], groups: list[list[str]],
            syncs: list[dict], micro: int, scale: float, meas: Measured | None,
            net: Network, hops) -> tuple[Strategy, float]:
    """A candidate's tasks simulated on `net`: (its Strategy, the iteration time)."""
    tasks, grads = pipeline_tasks(ctx, stages, groups, micro, scale, meas, syncs)
    res = simulate(tasks, net, record=False)
    return Strategy(name=name, fabric=ctx.fabric, hops=hops, network=net, tasks=tasks,
                    collective={}, buckets=[b for b in grads if b]), res.iteration_time


def measured_stage_costs(ctx: PlanContext, micro_batch: int) -> Measured | None:
    """This CPU's costs for a micro-batch of `micro_batch` samples when the hosts are lab CPUs
    and the machine caches are allowed (`PlanContext.train_costs`), else None (per-op costs of
    the context, scaled)."""
    if ctx.train_costs is None:
        return None
    ops = ctx.train_costs(micro_batch, runtime="stage")  # as topotrain.pipeline runs a stage
    if ops is None:  # the model does not train on real tensors here: the context's costs
        return None
    cal = load_calibration()
    inputs = ctx.inputs_cost(ctx.job.batch.global_) if ctx.inputs_cost is not None else 0.0
    return Measured(ops, runtime_costs(cal), shared_message_s(cal), lab=ctx.lab,
                    inputs_s=inputs, crowding=stage_crowding(ctx))


def stage_crowding(ctx: PlanContext) -> float:
    """The lab cores' crowding (`sim.network.CpuPool.crowding`) for pipeline ranks: a stage's
    CPU time at the ranks' batch beside co-running copies (as many as the lab has other ranks,
    up to three times as many ranks as cores in all) over alone (`PlanContext.crowded_ratio`),
    less one, per unit of the oversubscription those copies make (``(copies + 1) / cores - 1``);
    0 when the lab's ranks (at most 4 per core, as `planner.lab_corun`) do not outnumber the
    cores or there is no timing. Stages are timed alone (`planner._lab_timing`: how many compute at
    once is what the plan decides) and the simulator slows them while they crowd. Measured on
    the 2-core Xeon VM for the lab MLP at 64 rows beside 5 copies: 0.12-0.15
    (docs/results.md)."""
    cores = ctx.lab.cores
    copies = min(ctx.world_size, 4 * cores) - 1
    if (copies + 1) / cores <= 1.0 or ctx.crowded_ratio is None:
        return 0.0
    # timed at three times as many ranks as cores at most: every copy more costs the first plan
    # on a machine seconds of timing (`make demo`'s budget), but at twice as many the ratio is
    # the scheduler's luck, not the crowding (2-core Xeon VM, lab MLP at 64 rows, four timings
    # in a row under the quiet lock: 1.002, 1.178, 1.045, 1.007 beside 3 copies; 1.292, 1.242,
    # 1.216 beside 5: crowding 0.002-0.178 against 0.108-0.146; 5.7 s against 8.4 s a timing)
    timed = min(copies, 3 * cores - 1)
    # one timing per model, at the grid point at or below the ranks' batch, whatever the
    # micro-batch: a ratio of two timings, which moved less between micro-batches (0.12-0.16 for
    # the lab MLP at 24-96 rows) than between runs, and each costs a first plan about 8 s
    # (three micro-batches took the demo's first planning from 26 to 52 s)
    ratio = ctx.crowded_ratio(timing_grid(ctx.local_batch)[0], timed)
    return max(0.0, (ratio - 1.0) / ((timed + 1) / cores - 1.0)) if ratio else 0.0


def _fx_pos(ctx: PlanContext):
    pos = {o.name: i for i, o in enumerate(ctx.graph.ops)}
    return pos.__getitem__


def _min_devices_hint(ctx: PlanContext, coarse: CoarseGraph, cap: dict[str, float],
                      micro: int) -> str:
    scale = ctx.job.batch.global_ / micro / ctx.local_batch  # micro-batch of a pure pipeline
    need = sum(node_memory(n.param_bytes, scale * n.act_bytes, micro)
               for n in coarse.nodes.values())
    biggest = max(cap.values())
    k = -(-int(need) // int(biggest))
    return (f" (the model needs {need / 1e9:.3g} GB with {micro} micro-batches in flight; "
            f"devices hold {biggest / 1e9:.3g} GB: at least {k} devices, the job has "
            f"{len(ctx.hosts)})")


def plan_placement(ctx: PlanContext) -> Strategy:
    """Strategy `placement`: coarsen, place with the job's `parallelism.search` (MILP and/or HEFT),
    best candidate."""
    return search(ctx, ctx.job.parallelism.search, "placement")


def plan_pipeline(ctx: PlanContext) -> Strategy:
    """Strategy `pipeline`: the balanced contiguous partition of the same coarse graph (the
    baseline)."""
    return search(ctx, "partition", "pipeline")


PLANNER_STRATEGIES = {"placement": plan_placement, "pipeline": plan_pipeline}
