"""Planner strategy ``trees``: data parallelism with packed spanning trees (INFOCOM'21).

Same iteration as ``baseline`` (``baseline.dp_tasks``), but every gradient bucket is
all-reduced with the tree schedule that :func:`topoctl.collective.trees.pack.plan_trees` packs on
the cluster's fabric (capacities in bytes/s). Each bucket's AllReduce is two simulator tasks:
the network part, the tree schedule as a collective (:mod:`topoctl.collective.trees.simulate`,
links shared max-min fairly by the engine, pipelined in the chunk count the runtime will use),
then the runtime's CPU part (:mod:`topoctl.collective.trees.pipeline`: messages x per-message
cost + bytes reduced, copied and moved at the machine's calibrated rates, stretched by the ranks
that share the machine's cores) on a pseudo-device ``trees-cpu/ar<k>`` of its own (so that
it does not hold the hosts' compute), marked ``communication`` (so that the prediction's
``compute`` is the hosts' and the bucket's time counts as communication). The chunk size is
the one :func:`~topoctl.collective.trees.pipeline.choose_chunks` picks for the largest bucket.

The plan's ``job.collective`` carries the runtime schedule (``topotrain.collectives``): the
launcher writes it to a file and points ``$TOPO_TREE_SCHEDULE`` at it. Hosts of k > 1 ranks
(`plan_multi`): the hierarchical AllReduce with the trees as every shard's inter-host part.
Hosts whose device is the CPU are taken to be lab hosts, all ranks on this machine sharing
its cores (``PlanContext.lab``, a ``topoctl.labprofile.LabProfile``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from topocontract.schedule import TreeSchedule
from topocontract.trees import chunk_count
from topoctl.collective.trees.bounds import best_bound, tree_bounds
from topoctl.collective.trees.pack import TreePlan, plan_trees
from topoctl.collective.trees.pipeline import (
    RuntimeCosts,
    TreePrediction,
    choose_chunks,
    leave_fractions,
    link_rows,
    link_steps,
    predict,
    runtime_costs,
    tree_shape,
)
from topoctl.collective.trees.schedule import plan_to_schedule
from topoctl.collective.trees.simulate import tree_algorithm, tree_allreduce_schedule
from topoctl.fabric.capgraph import build_capgraph
from topoctl.fabric.graph import connection_links
from topoctl.labprofile import DEFAULT_LAB, LabProfile
from topoctl.limits import SafetyClock
from topoctl.sim.engine import simulate
from topoctl.sim.fabric import network_from_fabric, tcp_efficiency
from topoctl.sim.network import Network
from topoctl.sim.routing import shortest_next_hops
from topoctl.sim.tasks import Collective, Compute, member_done
from topotrain.timing import load_calibration

from . import PlanContext, Strategy, StrategyError
from .baseline import backward_task, dp_tasks
from .baseline import buckets as bucket_list
from .devices import (
    device_network,
    hierarchical_algorithm,
    hierarchical_collective,
    hierarchical_note,
    local_size,
    multi_rank,
    rank_count_refusal,
)

SIM_MAX_CHUNKS = 64  # chunks per tree the simulator schedule models at most (planning speed)
FUSION_MAX_HOSTS = 64  # bucket caps are searched up to this many hosts (one simulation each)


def plan(ctx: PlanContext) -> Strategy:
    """Pack trees on the fabric, bound them, schedule the gradient buckets over them.
    StrategyError for a job it cannot plan (one host, several ranks per host); FabricError
    when the fabric cannot carry it (disconnected, a training host without links)."""
    if len(ctx.hosts) < 2:
        raise StrategyError("needs at least two training hosts (one host has nothing to "
                            "all-reduce over the fabric): use baseline")
    if multi_rank(ctx):
        return plan_multi(ctx)
    links = [(ln.a, ln.b, ln.capacity / 8.0) for ln in connection_links(ctx.fabric)]
    g = build_capgraph(links, list(ctx.hosts))
    clock = SafetyClock()  # deterministic limits inside; this only guards against the absurd
    tp = plan_trees(g, clock=clock)
    bounds = tree_bounds(g, lp_upper=tp.upper_bound, clock=clock)
    bname, bval = best_bound(bounds)
    hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
    hosts = list(ctx.hosts)
    eff = tcp_efficiency(ctx.fabric.mtu)
    network = network_from_fabric(ctx.fabric, hops, rate_caps=lockstep_caps(tp, hosts, eff),
                                  cpu_pool=ctx.cpu_pool)
    rate = tp.rate * eff  # goodput of the packed trees
    latency = max((network.latency(path) for t in tp.trees for p, c in t.edges
                   for _, path in network.routes(hosts[c], hosts[p]) + network.routes(
                       hosts[p], hosts[c])), default=0.0)
    sched0 = plan_to_schedule(tp, chunk_bytes=1 << 20,
                              metadata={"hosts": hosts, "rate_bytes_per_s": tp.rate,
                                        "optimum_bytes_per_s": bval, "bound": bname})

    links = tree_links(sched0, hosts, network, ctx.fabric.mtu, ctx.lab)  # same for every cap

    def score(c: PlanContext) -> tuple[list, list[int], RuntimeFit]:
        _, sizes = dp_tasks(c, hosts, tree_algorithm(sched0))
        fit = fit_runtime(c, sched0, rate, latency, sizes, links)
        tasks, sizes = dp_tasks(c, hosts, tree_algorithm(fit.schedule, max_chunks=SIM_MAX_CHUNKS))
        return fit.with_cpu_part(tasks, sizes), sizes, fit

    fused = choose_fusion(ctx, network, score)
    tasks, sizes, fit = fused.tasks, fused.sizes, fused.fit
    return Strategy(
        name="trees",
        fabric=ctx.fabric,
        hops=hops,
        network=network,
        tasks=tasks,
        collective={"algorithm": "trees", "order": hosts, "schedule": fit.schedule.dump()},
        buckets=sizes,
        bucket_cap=fused.cap,
        notes={"trees": len(tp.trees), "rate_bytes_per_s": tp.rate, "optimum_bytes_per_s": bval,
               "bound": bname, "achieved_over_optimal": tp.rate / bval,
               **({"runtime": fit.note(sizes)} if sizes else {}), "fusion": fused.note()}
        | clock.report(),
    )


def lockstep_caps(tp: TreePlan, hosts: list[str], efficiency: float
                  ) -> dict[tuple[str, str], float]:
    """Per directed tree edge (sender, receiver host): the goodput (bytes/s) the lock-step
    runtime gives it, the sum of the rates of the trees that use it. Every step moves one chunk
    of every tree, sized to its rate, and waits for the slowest: no tree gets ahead of its
    share. The simulator's max-min sharing, left alone, would let the flows of two trees on
    one link split it evenly whatever their rates, so that the slower-planned tree finished
    early and the faster one late: on switch8 the plain trees were predicted 2.562 s per
    iteration where the lab's runtime took 2.338 s, each bucket as the lock-step model said,
    the same as with the per-destination rates `+bandwidth` installs."""
    caps: dict[tuple[str, str], float] = {}
    for t in tp.trees:
        for p, c in t.edges:
            for a, b in ((hosts[c], hosts[p]), (hosts[p], hosts[c])):
                caps[(a, b)] = caps.get((a, b), 0.0) + t.rate * efficiency
    return caps


def fusion_caps(ctx: PlanContext) -> list[int]:
    """Bucket caps (bytes) a tree strategy tries: the job's ``sync.bucket``, then doubled until
    one bucket holds the whole gradient; only the job's with ``sync.fusion: fixed`` or beyond
    ``FUSION_MAX_HOSTS`` hosts (each candidate costs a simulation)."""
    caps = [int(ctx.job.sync.bucket)]
    if ctx.job.sync.fusion == "search" and len(ctx.hosts) <= FUSION_MAX_HOSTS:
        total = sum(b for *_, b in ctx.graph.gradient_order())
        while caps[-1] < total:
            caps.append(caps[-1] * 2)
    return caps


def with_bucket(ctx: PlanContext, cap: int) -> PlanContext:
    """`ctx` with the job's bucket cap set to `cap` bytes (the tasks builders read it)."""
    sync = ctx.job.sync.model_copy(update={"bucket": cap})
    return replace(ctx, job=ctx.job.model_copy(update={"sync": sync}))


@dataclass(frozen=True)
class Fusion:
    """The bucket cap a tree strategy chose: its tasks, bucket sizes and runtime fit, and the
    simulated iteration of every candidate cap (bytes -> seconds; none when only one)."""

    cap: int
    tasks: list
    sizes: list[int]
    fit: RuntimeFit
    tried: dict[int, float]

    def note(self) -> dict:
        """The plan's ``metadata.collective.fusion`` (``topoctl explain`` prints it)."""
        return {"bucket_bytes": self.cap, "buckets": len(self.sizes),
                "candidates": [[c, round(t, 6)] for c, t in sorted(self.tried.items())]}


def choose_fusion(ctx: PlanContext, network: Network,
                  score: Callable[[PlanContext], tuple[list, list[int], RuntimeFit]],
                  search: bool = True) -> Fusion:
    """Tensor fusion for the tree runtime (TAG, DisCo: the bucket size is part of the plan):
    every cap of :func:`fusion_caps` is built by `score` (tasks with the runtime's CPU part,
    bucket sizes, fit) and simulated on `network`; the fastest wins, the job's own cap on a
    tie. Why: each bucket's lock-step AllReduce pays its pipeline's fill and drain
    (``2 h_t - 1`` steps) and its per-message CPU, one bucket after another, while fewer,
    larger buckets overlap less with the backward pass; which wins depends on the model's
    compute against the fabric. Caps giving the same buckets are simulated once. `search`
    False: the job's cap only."""
    best: Fusion | None = None
    tried: dict[int, float] = {}
    seen: set[tuple[int, ...]] = set()
    caps = fusion_caps(ctx) if search else [int(ctx.job.sync.bucket)]
    for cap in caps:
        c = with_bucket(ctx, cap)
        tasks, sizes, fit = score(c)
        if tuple(sizes) in seen:
            continue
        seen.add(tuple(sizes))
        if len(caps) == 1:
            return Fusion(cap, tasks, sizes, fit, {})
        t = simulate(tasks, network, record=False).iteration_time
        tried[cap] = t
        if best is None or t < tried[best.cap] * (1 - 1e-9):
            best = Fusion(cap, tasks, sizes, fit, tried)
    assert best is not None
    return best


@dataclass(frozen=True)
class RuntimeFit:
    """A tree schedule fitted to the lock-step runtime: its chunk size, the per-bucket
    predictions (network and CPU part) and the CPU costs they used."""

    schedule: TreeSchedule
    preds: dict[int, TreePrediction]  # bucket bytes -> prediction
    costs: RuntimeCosts
    # the hosts whose ranks outnumber this machine's cores (the lab), else empty
    shared: tuple[str, ...] = ()
    # bucket bytes -> host -> the share of the AllReduce after which its rank leaves it (in
    # the lab: after which its next compute has the cores the runtime leaves free)
    leave: dict[int, dict[str, float]] | None = None

    def with_cpu_part(self, tasks: list, sizes: list[int]) -> list:
        """`tasks` (one ``Collective`` per bucket of `sizes`, in order, as
        :func:`~topoctl.strategies.baseline.dp_tasks` builds them) with every bucket's
        runtime time beside its collective (see :func:`_with_cpu_part`): the larger of the
        lock-step network part and the CPU part. The simulated collective keeps the links
        busy; the engine's pipelining is not lock-step (it overlaps steps the runtime runs one
        after another), so the lock-step model bounds the bucket from below.

        Ranks that outnumber the machine's cores (`shared`): the runtime's time starts when the
        ranks' backward is done. Its lock-step steps each need every rank's thread on a core,
        and while the ranks compute, the cores are theirs: traced on hetero8 and mesh5, the
        first bucket, handed over mid-backward, took 26-30 ms longer than
        the next ones of its size, about as long as the backward it overlapped.

        The last bucket's ranks leave it one by one (`leave`): each host's optimizer step
        waits for its own part of the collective and of the runtime's time, so that the next
        iteration's compute can start under the AllReduce's tail (`topoctl.sim.steady`)."""
        hold = tuple(backward_task(len(sizes), h) for h in self.shared)
        leave = self.leave[sizes[-1]] if self.leave and sizes else None
        return _with_cpu_part(tasks, [self.preds[s].seconds for s in sizes], hold, leave)

    def note(self, sizes: list[int]) -> dict:
        """The plan's ``metadata.collective.runtime`` (``topoctl explain`` prints it)."""
        return _runtime_note(self.preds, sizes, self.costs.source, self.schedule.chunk_bytes)


def tree_rate(sched: TreeSchedule, hosts: list[str], network: Network) -> tuple[float, float]:
    """(total rate in bytes/s of goodput, largest path latency in s) of a tree schedule over
    `network`: the largest ``R`` with every tree ``t`` at ``R x_t`` (``x_t`` its share of the
    rates) and, on every link, the trees' edges routed over it (both directions, multipath
    weights) within its capacity. O(T N P) for T trees of N ranks, paths of P links."""
    total = sum(t.rate for t in sched.trees)
    load: dict[str, float] = {}
    latency = 0.0
    for t in sched.trees:
        for child, parent in enumerate(t.parents):
            if parent is None:
                continue
            for a, b in ((child, parent), (parent, child)):
                for w, path in network.routes(hosts[a], hosts[b]):
                    latency = max(latency, network.latency(path))
                    for lid in path:
                        load[lid] = load.get(lid, 0.0) + w * t.rate / total
    rate = min((network.links[lid].capacity / x for lid, x in load.items() if x > 0),
               default=0.0)
    return rate, latency


def tree_link_uses(sched: TreeSchedule, hosts: list[str], network: Network
                   ) -> dict[tuple[int, int], list[tuple[str, float]]]:
    """Per directed tree edge (sender, receiver rank) of `sched`: the links its messages cross
    with multipath weight / capacity (:func:`~topoctl.collective.trees.pipeline.link_steps`).
    O(T N P)."""
    uses: dict[tuple[int, int], list[tuple[str, float]]] = {}
    for t in sched.trees:
        for child, parent in enumerate(t.parents):
            if parent is None:
                continue
            for a, b in ((child, parent), (parent, child)):
                if (a, b) not in uses:
                    uses[(a, b)] = [(lid, w / network.links[lid].capacity)
                                    for w, path in network.routes(hosts[a], hosts[b])
                                    for lid in path]
    return uses


@dataclass(frozen=True)
class FillDrain:
    """What the fill and drain steps of a tree schedule's program cost on a network
    (:func:`tree_links`): how full each link is in them
    (:func:`~topoctl.collective.trees.pipeline.link_steps`) and, per link (same rows), the
    token credit in seconds a lab cable of its rate has (``LabProfile.cable_credit_s``)."""

    steps: np.ndarray
    credit_s: np.ndarray


def tree_links(sched: TreeSchedule, hosts: list[str], network: Network, mtu: int,
               lab: LabProfile = DEFAULT_LAB) -> FillDrain:
    """The fill and drain steps of `sched` on `network` (frames of `mtu` bytes): computed once
    per schedule, for every :func:`fit_runtime` of it. A link's credit is the one `lab`
    shapes a cable of its line rate with (its capacity is goodput: ``tcp_efficiency``)."""
    shape = tree_shape([t.parents for t in sched.trees], [t.rate for t in sched.trees])
    uses = tree_link_uses(sched, hosts, network)
    eff = tcp_efficiency(mtu)
    credit = [lab.cable_credit_s(network.links[lid].capacity * 8.0 / eff, mtu)
              for lid in link_rows(shape, uses)]
    return FillDrain(link_steps(shape, uses), np.array(credit, dtype=float))


def fit_runtime(ctx: PlanContext, sched: TreeSchedule, rate: float, latency: float,
                sizes: list[int], links: FillDrain | None = None) -> RuntimeFit:
    """Fit `sched` (any tree schedule over the hosts in rank order: packed trees, TopoOpt's
    path trees) to the runtime that will execute it, as the ``trees`` strategy plans it: the
    chunk count minimising network + CPU part of the largest bucket
    (:func:`~topoctl.collective.trees.pipeline.choose_chunks`, machine calibration when
    ``ctx.use_cache``; CPU hosts are taken to share the cores of the lab machine ``ctx.lab``
    and to be the lab's, whose cables have token credit: :class:`FillDrain`), the schedule's
    ``chunk_bytes`` set from it (per-tree overrides dropped), and what the runtime then does
    with every bucket size (its own chunk count from ``chunk_bytes``). `rate`: the trees'
    total goodput in bytes/s; `latency`: the largest path latency of a tree edge; `links`:
    :func:`tree_links` of `sched`, for the pipeline's fill and drain steps (without it every
    step is charged as a full one)."""
    costs = runtime_costs(load_calibration() if ctx.use_cache else None)
    hosts = list(ctx.hosts)
    colocated = len(hosts) if all(ctx.device[h].name == "CPU" for h in hosts) else 1
    shape = tree_shape([t.parents for t in sched.trees], [t.rate for t in sched.trees])
    # the lab's shaped cables send their token credit at once after idling (real links do not)
    lab = colocated >= len(hosts) > 1
    steps = links.steps if links is not None else None
    credit = links.credit_s if links is not None and lab else 0.0
    best = choose_chunks(shape, float(max(sizes, default=0)), rate, costs, colocated, latency,
                         links=steps, credit_s=credit, lab=ctx.lab)
    meta = dict(sched.metadata)
    meta["pipeline"] = {"chunks": best.chunks, "for_bytes": int(max(sizes, default=0)),
                        "cpu_costs": costs.source}
    fitted = TreeSchedule.model_validate(
        sched.dump() | {"chunk_bytes": max(1, best.chunk_bytes), "metadata": meta,
                        "trees": [{k: v for k, v in t.items() if k != "chunk_bytes"}
                                  for t in sched.dump()["trees"]]})
    preds = {}
    for size in sorted(set(sizes)):
        c = chunk_count(fitted, max(1, size // 4), 4)
        preds[size] = predict(shape, float(size), rate, c, costs, colocated, latency, steps,
                              credit, ctx.lab)
    if sizes:
        fitted.metadata["pipeline"]["chunks"] = preds[max(sizes)].chunks
    # more ranks than cores: their compute holds the cores (`RuntimeFit.with_cpu_part`)
    shared = tuple(hosts) if colocated > ctx.lab.cores else ()
    leave = {}
    for size, p in preds.items():
        # ranks sharing the cores (the lab) compute under the tail only in what the runtime and
        # the cable emulation leave of the cores: about 1 - cpu_s / seconds of them (tworack8,
        # the early ranks' next compute stretched the AllReduce's tail; with the
        # full tail credited the trees were predicted 4.5% and trees+bandwidth 10% short)
        busy = min(1.0, p.cpu_s / p.seconds) if shared and p.seconds > 0 else 0.0
        leave[size] = {h: 1.0 - (1.0 - f) * (1.0 - busy)
                       for h, f in zip(hosts, leave_fractions(shape, p.chunks), strict=True)}
    return RuntimeFit(fitted, preds, costs, shared, leave)


def _with_cpu_part(tasks: list, cpu: list[float], hold: tuple[str, ...] = (),
                   leave: dict[str, float] | None = None) -> list:
    """Beside every bucket's collective ``ar{k}``, a task ``ar{k}/cpu`` of `cpu` seconds (the
    runtime's own time for the bucket) that starts with it (same dependencies, and the tasks
    `hold` names) on a pseudo-device of its own; whatever waited for ``ar{k}`` waits for both.
    The runtime overlaps its CPU work with the transfers, so the bucket takes the larger of
    the two. The collectives are marked ``own_cpu`` (the simulator does not charge their
    messages to the lab's cores again, `sim.network.CpuPool.messages`).

    `leave` (host -> share of the runtime's time after which its rank leaves the last
    bucket's AllReduce, :func:`~topoctl.collective.trees.pipeline.leave_fractions`): a host's
    compute that waited for the last bucket waits for that host's part only: its part of the
    collective (``member_done``) and a task ``ar{k}/cpu@host`` of that share of the time."""
    coll = [t.id for t in tasks if isinstance(t, Collective)]
    last = coll[-1] if coll and leave else None
    renamed = {c: (c, f"{c}/cpu") for c in coll}
    out = []
    k = 0
    for t in tasks:
        sub = renamed
        if isinstance(t, Compute) and last in t.deps and t.device in leave:
            sub = renamed | {last: (member_done(last, t.device), f"{last}/cpu@{t.device}")}
        deps = tuple(d2 for d in t.deps for d2 in sub.get(d, (d,)))
        changes = {"deps": deps}
        if t.id == last:
            changes["member_done"] = True
        if isinstance(t, Collective):  # its CPU is ``ar{k}/cpu``: not the engine's to charge
            changes["own_cpu"] = True
        out.append(replace(t, **changes))
        if isinstance(t, Collective):
            start = tuple(dict.fromkeys(deps + hold))
            out.append(Compute(f"{t.id}/cpu", f"trees-cpu/{t.id}", cpu[k], start,
                               communication=True))
            if t.id == last:
                out += [Compute(f"{t.id}/cpu@{h}", f"trees-cpu/{t.id}@{h}", cpu[k] * share,
                                start, communication=True) for h, share in leave.items()]
            k += 1
    return out


def _runtime_note(preds: dict, sizes: list[int], source: str, chunk_bytes: int) -> dict:
    """Network and CPU part of the iteration's tree AllReduces (sum over buckets), each
    bucket's runtime seconds (in DDP's order: what `topoctl run` measures per bucket), and the
    largest bucket's pipeline."""
    big = preds[max(sizes)]
    return {"buckets": len(sizes), "network_s": sum(preds[s].network_s for s in sizes),
            "bucket_seconds": [round(preds[s].seconds, 6) for s in sizes],
            "cpu_s": sum(preds[s].cpu_s for s in sizes),
            "exposed_cpu_s": sum(preds[s].exposed_cpu_s for s in sizes), "chunks": big.chunks,
            "chunk_bytes": chunk_bytes, "steps": big.steps, "messages": big.messages,
            "ranks_per_core": big.share, "cpu_costs": source}


PLANNER_STRATEGIES = {"trees": plan}


MULTI_MAX_CHUNKS = 16  # chunks per tree per shard the simulator models on multi-rank hosts
MULTI_MIN_CHUNK = 64 << 10  # bytes: the smallest chunk a multi-rank plan's schedule asks for


def shard_capgraph(ctx: PlanContext, k: int, rail: int | None):
    """The capacity graph one shard's trees are packed on (bytes/s): with rails, rail `rail`'s
    own links (every host's NIC `rail` and what it is cabled to); else the whole fabric with
    every capacity divided by the `k` shards that share it at once (the LP sees a host's NICs
    shared by its k shards). FabricError when the graph does not join the hosts."""
    if rail is None:
        links = [(ln.a, ln.b, ln.capacity / 8.0 / k) for ln in connection_links(ctx.fabric)]
        return build_capgraph(links, list(ctx.hosts))
    nic = {h: ctx.cluster.rails(h)[rail] for h in ctx.hosts}  # type: ignore[index]
    links = [(ln.a, ln.b, ln.capacity / 8.0) for ln in ctx.fabric.links
             if (ln.a in nic and ln.a_nic == nic[ln.a]) or (ln.b in nic and ln.b_nic == nic[ln.b])]
    return build_capgraph(links, list(ctx.hosts))


def plan_multi(ctx: PlanContext) -> Strategy:
    """Trees on hosts of k > 1 ranks: the hierarchical AllReduce (`strategies.devices`) with
    packed trees as the inter-host part of every shard. The trees of a shard are packed on
    the fabric with each capacity shared by the k shards, or with rails (`gpus.nics: rails`)
    on each rail's own links (`shard_capgraph`). The plan's collective: `algorithm: trees`,
    the schedule over the hosts (rail 0's with rails: the rails of the example fabrics are
    alike; every rail's own rate is in the notes), `hierarchical: {local_size: k}`."""
    k = local_size(ctx)
    if k == 0:
        raise StrategyError(rank_count_refusal(ctx, "the hierarchical AllReduce needs the same "
                                                    "rank count on every host"))
    hosts = list(ctx.hosts)
    rails = all(ctx.cluster.rails(h) for h in hosts)
    clock = SafetyClock()
    plans, scheds = [], []
    # chunks sized so the largest bucket's shard pipelines in MULTI_MAX_CHUNKS chunks per tree
    largest = max((b for _, b in bucket_list(ctx.graph, ctx.job.sync.bucket)), default=1)
    chunk = max(MULTI_MIN_CHUNK, int(largest / k / MULTI_MAX_CHUNKS))
    for i in range(k if rails else 1):
        g = shard_capgraph(ctx, k, i if rails else None)
        tp = plan_trees(g, clock=clock)
        bname, bval = best_bound(tree_bounds(g, lp_upper=tp.upper_bound, clock=clock))
        plans.append((tp, bname, bval))
        scheds.append(plan_to_schedule(tp, chunk_bytes=chunk, metadata={
            "hosts": hosts, "rate_bytes_per_s": tp.rate, "optimum_bytes_per_s": bval,
            "bound": bname}))

    def shard(i: int, members, size: float):
        return tree_allreduce_schedule(list(members), size, scheds[i if rails else 0],
                                       max_chunks=MULTI_MAX_CHUNKS)

    algorithm, members = hierarchical_algorithm(ctx, hosts, shard)
    hops = shortest_next_hops(ctx.fabric, required=hosts)
    base = network_from_fabric(ctx.fabric, hops, cpu_pool=ctx.cpu_pool)
    tasks, sizes = dp_tasks(ctx, members, algorithm)
    tp, bname, bval = plans[0]
    return Strategy(
        name="trees", fabric=ctx.fabric, hops=hops, network=device_network(ctx, base),
        tasks=tasks,
        collective=hierarchical_collective(
            {"algorithm": "trees", "order": hosts, "schedule": scheds[0].dump()}, k),
        buckets=sizes,
        notes={"trees": len(tp.trees), "rate_bytes_per_s": tp.rate, "optimum_bytes_per_s": bval,
               "bound": bname, "achieved_over_optimal": tp.rate / bval,
               "shards": k, "rails": rails,
               "rail_rates_bytes_per_s": [p[0].rate for p in plans] if rails else None,
               "hierarchical": hierarchical_note(ctx, sum(sizes))} | clock.report(),
    )
