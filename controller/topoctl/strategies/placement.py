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
s + 1). Hosts of k > 1 ranks each: a stage is a set of devices, g hosts x q local devices for every
g dividing the hosts and q dividing k (`strategies.devices.stage_device_groups`: replicas along
local rank; stages of part of a host pass their activations over the intra-host link),
simulated on the network with every device a node (`strategies.devices.device_network`); hosts
of different counts are refused. Each is scored by the simulator on the GPipe iteration model
(`topoctl.pipeline.gpipe`): per replica, a GPipe iteration of `microbatches` micro-batches
(every forward, then every backward in reverse, one compute stream per host), activations and
their gradients crossing consecutive stages as flows on the fabric, then the stage's gradient
sync over its group and the optimiser step. Each replicated stage's sync (gloo's ring, a
parameter server on one of its hosts, or packed trees over the stage's own cables with the tree
runtime's per-member CPU; `none` for one replica) is chosen by simulating every option alone on
the plan's network (`placement.stagesync.choose_sync`) and stated per stage in the plan
(`topocontract.stages`). `search_shape` plans a fixed shape whose stages may have unequal
replica counts (each replica a share of every micro-batch's rows). The fastest candidate is
returned. Stages are the placement's devices in the order of the acyclic graph between them;
values produced before a boundary and read after it cross it (the runtime,
`topotrain.pipeline`, forwards them stage by stage), which is what the simulator charges.

Bad input: a model that fits on no device, fewer hosts than the memory needs, a batch that
does not split into micro-batches: `JobError` naming the cause; nothing is written.
O(candidates * (search + simulation)).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from topoctl.apportion import apportion
from topoctl.fabric.graph import connection_links
from topoctl.graph.coarsen import CoarseGraph, coarsen_graph, from_opgraph
from topoctl.pipeline.gpipe import (
    Measured,
    cut_bytes,
    default_sync,
    grad_bytes,
    lab_network,
    measured_stage_costs,
    pipeline_tasks,
    shared_quotas,
    sync_cpu,
    trees_cpu_model,
)
from topoctl.placement import heft, partition
from topoctl.placement.build import build_problem, node_memory, route_matrix
from topoctl.placement.problem import Placement, PlacementError, PlacementProblem, serial
from topoctl.placement.search import candidates
from topoctl.placement.stagesync import choose_sync, stage_trees, tree_cpu
from topoctl.sim.devices import split_device
from topoctl.sim.engine import simulate
from topoctl.sim.fabric import network_from_fabric, tcp_efficiency
from topoctl.sim.network import Network
from topoctl.sim.routing import shortest_next_hops
from topoctl.spec.job import JobError
from topoctl.strategies import PlanContext, Strategy, StrategyError
from topoctl.strategies.devices import (
    device_groups,
    device_network,
    local_size,
    rank_count_refusal,
    rank_of,
    stage_device_groups,
    stage_shapes,
)

MILP_NODE_LIMIT = 10  # deterministic; the gap is reported in the plan


@dataclass
class Candidate:
    """One scored pipeline candidate: stage groups, the placement, ops per stage and the simulated
    strategy."""

    groups: list[list[str]]
    placement: Placement
    stages: list[list[str]]  # fx op names per stage, in stage order
    stage_groups: list[list[str]]  # simulator nodes per stage (hosts, or devices h0/g1)
    strategy: Strategy
    iteration_time: float
    syncs: list[dict]  # per stage (topocontract.stages; a server named by its node)
    sync_times: list[dict[str, float]]  # per stage: each sync option's simulated seconds
    label: str = ""  # the shape in the plan's notes (`_shape_label`)


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


def choose_syncs(ctx: PlanContext, stages: list[list[str]], groups: list[list[str]],
                 network: Network, measured: Measured | None
                 ) -> tuple[list[dict], list[dict[str, float]]]:
    """Per stage the fastest sync of its replicas by simulation on `network`
    (`placement.stagesync.choose_sync`: ring, a server on each member (on hosts of several
    devices the stage's first device of each host, the one the plan's host names), and
    packed trees over the stage's own cables, `stage_trees`, with their CPU model; a stage of
    devices has no cables of its own, so no trees) and every option's seconds."""
    cpu = sync_cpu(measured)
    costs, lab = trees_cpu_model(ctx, measured)
    links = [(ln.a, ln.b, ln.capacity / 8.0) for ln in connection_links(ctx.fabric)]
    eff = tcp_efficiency(ctx.fabric.mtu)
    picked = []
    for grp, b in zip(groups, grad_bytes(ctx, stages), strict=True):
        trees = stage_trees(links, grp, float(b), costs, lab, eff)
        # a server is named by its host in the plan: one device per host may be it
        servers = list({split_device(d)[0]: d for d in reversed(grp)}.values())
        picked.append(choose_sync(network, grp, float(b), cpu, trees, tree_cpu(costs, lab),
                                  servers))
    return [p[0] for p in picked], [p[1] for p in picked]


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


def _device_grid(ctx: PlanContext, name: str) -> tuple[list[list[str]], int]:
    """(each training host's simulator nodes in rank order, ranks per host) for the stage
    shapes (`strategies.devices.stage_device_groups`); StrategyError when the hosts run
    different rank counts, JobError when there are fewer than 2 devices."""
    k = local_size(ctx)
    if k == 0:  # the grid of stages needs the same devices on every host
        raise StrategyError(rank_count_refusal(
            ctx, f"pipeline stages over devices need the same rank count on every host; the "
                 f"job has {ctx.world_size} ranks on {len(ctx.hosts)} hosts"))
    if len(ctx.hosts) * k < 2:
        raise JobError([("hosts", f"strategy {name}: a pipeline needs at least 2 hosts, the "
                                  f"job has {len(ctx.hosts)}")])
    return device_groups(ctx), k


def _shape_label(nstages: int, g: int, q: int, k: int) -> str:
    """A candidate's name in the plan's notes: ``stages x replicas``, with several devices per
    host also the hosts x devices of a stage."""
    return f"{nstages}x{g * q}" + (f" ({g} hosts x {q} devices)" if k > 1 else "")


def _node_tables(ctx: PlanContext, members: list[str]
                 ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Per simulator node (a device, or a one-rank host): its host's per-op seconds
    (forward + backward) and its device's memory."""
    host = {m: split_device(m)[0] for m in members}
    cost = {h: {o: c.fwd + c.bwd for o, c in ctx.host_costs(h).items()}
            for h in dict.fromkeys(host.values())}
    return ({m: cost[host[m]] for m in members},
            {m: ctx.device[host[m]].memory for m in members})


def search(ctx: PlanContext, method: str, name: str, replicas: int | None = None,
           split: bool = False, sync: str | None = None,
           stage: tuple[int, int] | None = None) -> Strategy:
    """All candidates (module docstring), the fastest as a Strategy. For lab checks of one
    shape (`bench/placement/hybrid_lab_check.py`): `replicas` keeps only that group size,
    `stage` only stages of so many (hosts, devices) (`stage_device_groups`), `split` drops
    the no-split candidate, `sync="ring"` states today's ring on every replicated stage
    instead of choosing by simulation; the planner's strategies use none of them."""
    devs, k = _device_grid(ctx, name)
    members = [d for grp in devs for d in grp]
    micro = ctx.job.parallelism.microbatches
    coarse, cstats = _coarse(ctx)
    hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
    network = device_network(ctx, network_from_fabric(ctx.fabric, hops))
    op_cost, cap = _node_tables(ctx, members)
    global_batch = ctx.job.batch.global_
    cands: list[Candidate] = []
    errors: list[str] = []
    for g, q in stage_shapes(len(devs), k):
        r = g * q  # replicas of every stage
        if replicas not in (None, r) or stage not in (None, (g, q)):
            continue
        if global_batch % (r * micro):
            errors.append(f"{len(devs) * k // r} stages x {r} replicas: batch.global "
                          f"{global_batch} does not split into {r} x {micro} micro-batches")
            continue
        groups = stage_device_groups(devs, g, q)
        found = _shape_candidates(ctx, method, name, coarse, groups, op_cost, cap, network,
                                  hops, members, split, sync, errors)
        if found is not None:
            found.label = _shape_label(len(groups), g, q, k)
            cands.append(found)
    if not cands:
        raise JobError([("model", f"strategy {name}: no pipeline fits: " + "; ".join(
            dict.fromkeys(errors)) + _min_devices_hint(ctx, coarse, cap, micro))]) from None
    best = min(cands, key=lambda c: (c.iteration_time, len(c.groups[0])))
    return _finish(ctx, best, cands, cstats)


def _shape_candidates(ctx: PlanContext, method: str, name: str, coarse: CoarseGraph,
                      groups: list[list[str]], op_cost: dict[str, dict[str, float]],
                      cap: dict[str, float], network: Network, hops, members: list[str],
                      split: bool, sync: str | None, errors: list[str]) -> Candidate | None:
    """The placements of the coarse graph on the stage groups `groups` (`_search`, and the
    no-split one unless `split`), each simulated; the fastest (None when none places: the
    reason appended to `errors`)."""
    micro, global_batch = ctx.job.parallelism.microbatches, ctx.job.batch.global_
    r = len(groups[0])
    scale = global_batch / (r * micro) / ctx.local_batch
    meas = measured_stage_costs(ctx, global_batch // (r * micro))
    if meas:  # timed at this candidate's micro-batch: no scaling
        mc = {o: c.fwd + c.bwd_inputs for o, c in meas.ops.items()}
        p = build_problem(coarse, groups, dict.fromkeys(members, mc), cap, network, micro,
                          scale, cost_scale=ctx.job.cost.scale,
                          dtype_bytes=ctx.graph.dtype_bytes)
    else:
        p = build_problem(coarse, groups, op_cost, cap, network, micro, scale,
                          dtype_bytes=ctx.graph.dtype_bytes)
    try:
        tries = _search(p, method)
    except PlacementError as e:
        errors.append(str(e))
        return None
    one = serial(p)  # no split at all: the simulator decides whether the split pays
    if not split and one is not None and all(t.assign != one.assign for t in tries):
        tries.append(one)
    net = lab_network(network, members, meas, ctx.fabric.mtu, shared_quotas(ctx))
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
        syncs, sync_times = (([default_sync(grp) for grp in sgroups], [{}] * len(sgroups))
                             if sync == "ring" else
                             choose_syncs(ctx, stages, sgroups, net, meas))
        strat, t = _scored(ctx, name, stages, sgroups, syncs, micro, scale, meas, net, hops)
        found.append(Candidate(groups, pl, stages, sgroups, strat, t, syncs, sync_times))
    # the fastest; on ties a split before no split, then the better objective
    return min(found, key=lambda c: (c.iteration_time, len(c.stages) == 1))


def _contract_sync(sync: dict) -> dict:
    """A stage's sync as the plan states it (`topocontract.stages`): a parameter server is
    named by its host (the simulator's by its device node; `choose_syncs` offers only the
    first device of each host in the stage, the one the runtime takes for that host)."""
    if sync.get("kind") == "ps":
        return sync | {"server": split_device(sync["server"])[0]}
    return sync


def _finish(ctx: PlanContext, best: Candidate, cands: list[Candidate], cstats: dict
            ) -> Strategy:
    """The best candidate's Strategy with the plan's collective (`topocontract.stages`: per
    stage its hosts, one per replica, repeated for several devices of a host, and the
    replicas' ranks) and the notes `explain` prints."""
    s = best.strategy
    micro, global_batch = ctx.job.parallelism.microbatches, ctx.job.batch.global_
    stage_of = {op: i for i, ops in enumerate(best.stages) for op in ops}
    g = len(best.stage_groups[0])
    scale = global_batch / (g * micro) / ctx.local_batch
    cut = cut_bytes(ctx, stage_of, len(best.stages), scale)
    syncs = [_contract_sync(sy) for sy in best.syncs]
    s.collective = {
        "algorithm": "pipeline", "schedule": "gpipe", "microbatches": micro,
        "micro_batch": global_batch // (g * micro), "replicas": g,
        "stages": [{"hosts": [split_device(d)[0] for d in grp],
                    "ranks": [rank_of(ctx, d) for d in grp],
                    "ops": list(ops), "send_bytes": int(cut[i]) if i < len(cut) else 0,
                    "sync": syncs[i]}
                   for i, (grp, ops) in enumerate(zip(best.stage_groups, best.stages,
                                                       strict=True))]}
    s.notes = {"search": best.placement.algorithm, "gap": best.placement.gap,
               "stages": len(best.stages), "replicas": g,
               "objective_s": best.placement.objective,
               "coarsening": cstats,
               "sync": [{"kind": sy["kind"], **({"server": sy["server"]} if "server" in sy
                                                 else {}), "options_s": t}
                        for sy, t in zip(syncs, best.sync_times, strict=True)],
               "candidates": {c.label: c.iteration_time for c in cands}}
    if local_size(ctx) > 1:  # which devices each stage runs on (the ranks say the same)
        s.notes["devices"] = [list(grp) for grp in best.stage_groups]
    meas = measured_stage_costs(ctx, global_batch // (g * micro))
    if meas is not None:  # what the lab prediction rests on (docs/placement.md)
        s.notes["compute"] = {"cost": "measured on this CPU at the micro-batch",
                              "micro_batch": global_batch // (g * micro),
                              "threads": ctx.job.launch.threads,
                              "runtime_cpu": meas.runtime.source if meas else None,
                              "inputs_s": meas.inputs_s, "crowding": meas.crowding}
    return s


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
    shares = [apportion(total, [1.0] * n) for n in shape]  # even: the first one more
    coarse, cstats = _coarse(ctx)
    hops = shortest_next_hops(ctx.fabric, required=hosts[:sum(shape)])
    network = network_from_fabric(ctx.fabric, hops)
    # the partition balances a stage's replicas at their rows: a group's costs / its size
    op_cost = {h: {o: (c.fwd + c.bwd) / len(grp) for o, c in ctx.host_costs(h).items()}
               for grp in groups for h in grp}
    p = build_problem(coarse, [grp[:1] for grp in groups], op_cost, _capacity(ctx), network,
                      micro, total / ctx.local_batch, dtype_bytes=ctx.graph.dtype_bytes)
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
    net = lab_network(network, [h for grp in groups for h in grp], meas, ctx.fabric.mtu,
                      shared_quotas(ctx))
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


def _fx_pos(ctx: PlanContext):
    pos = {o.name: i for i, o in enumerate(ctx.graph.ops)}
    return pos.__getitem__


def _min_devices_hint(ctx: PlanContext, coarse: CoarseGraph, cap: dict[str, float],
                      micro: int) -> str:
    scale = ctx.job.batch.global_ / micro / ctx.local_batch  # micro-batch of a pure pipeline
    need = sum(node_memory(n.param_bytes, scale * n.act_bytes, micro, ctx.graph.dtype_bytes)
               for n in coarse.nodes.values())
    biggest = max(cap.values())
    k = -(-int(need) // int(biggest))
    return (f" (the model needs {need / 1e9:.3g} GB with {micro} micro-batches in flight; "
            f"devices hold {biggest / 1e9:.3g} GB: at least {k} devices, the job has "
            f"{len(cap)})")


def plan_placement(ctx: PlanContext) -> Strategy:
    """Strategy `placement`: coarsen, place with the job's `parallelism.search` (MILP and/or HEFT),
    best candidate."""
    return search(ctx, ctx.job.parallelism.search, "placement")


def plan_pipeline(ctx: PlanContext) -> Strategy:
    """Strategy `pipeline`: the balanced contiguous partition of the same coarse graph (the
    baseline)."""
    return search(ctx, "partition", "pipeline")


PLANNER_STRATEGIES = {"placement": plan_placement, "pipeline": plan_pipeline}
