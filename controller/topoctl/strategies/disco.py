"""Post-pass ``+disco``: the gradient buckets (and, given its costs, the operator fusion) of a
data-parallel ring plan chosen by DisCo's search (`topoctl.disco.search`), every candidate
scored by the simulator on the plan's own network.

Units are the model's parameters in gradient-ready order (`OpGraph.gradient_order`); a
bucket is any run of consecutive units; the plan names each bucket's parameters
(``job.collective.bucket_plan``, `topocontract.buckets`) and the runtime (`topotrain.buckets`)
starts a bucket's AllReduce once its last gradient is ready. In the simulator one iteration
is: per host forward, backward in chunks ending where a bucket's last op ends (and its
gradients are flattened into the bucket's buffer on the rank's main thread: `flatten_s`), one
ring AllReduce per bucket, issued as soon as it is flattened and queued on the process group's
one connection per peer in issue order (gloo's asynchronous AllReduces share the group's
pairs: `baseline.bucket_allreduces`, `topoctl.sim.connections`), the step. On
lab hosts the simulator charges each AllReduce's messages the runtime's CPU
(`topoctl.sim.network.CpuPool.messages`, as for every strategy): per bucket gloo's
per-message time, and the CPU its bytes take from the compute it overlaps.

The fusion choice is an input of plain data: `fusion_options` maps an option's name to its
per-op costs (`OpCost`, on the first host's device); a host runs an option at that host's
"none" costs scaled by the option's total over the reference's. The registered strategy
passes the operator-fusion options of `topoctl.disco.fusion.costs` (none, groups, whole: a fused
region's cost on its last op, priced by the roofline on a modelled device and by the learned
model where the ranks' ops were timed on this CPU); the chosen regions travel in the plan as
``job.fusion`` (`topocontract.fusion`), which the runtime compiles (`topotrain.fusion`).

The search also chooses what the AllReduces overlap with (``job.collective.bucket_overlap``):
the backward pass (DDP's timeline, the default, above) or the next forward pass (``forward``,
cross-iteration overlap as ByteScheduler and PACE schedule it: a layer's next forward waits
for its bucket's AllReduce, `overlap_tasks`), and for the latter how many of the last-ready
buckets (the first layers') are held back and all-reduced first-layer-first
(`topoctl.disco.search.issue_order`: the plan lists the buckets in that order). Such a plan's
iteration is the simulator's steady-state period (`topoctl.sim.steady`).

The search starts from the anchors, each also reported in the plan's notes with its
simulated iteration: DDP's defaults (25 MB, 1 MB first bucket), the job's cap (the
baseline), every cap of {1, 5, 10, 25, 50, 100} MB, MG-WFBP's merge, a Horovod-style
autotune of the cap, the exact optimum of the latency-bandwidth model, and one bucket; the
result is never slower than the best of them in the simulator. Budget: `BUDGET` simulations,
progress on stderr. Declared as the post-pass ``disco`` (`strategies.post_pass`):
``baseline+disco`` (alias ``disco``), right after the base.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from topoctl.disco.autotune import autotune_cap
from topoctl.disco.fusion.costs import fusion_options, fusion_plan
from topoctl.disco.priority import (
    BS_CREDIT_ELEMENTS,
    BS_PARTITION_ELEMENTS,
    cut,
    search_slicing,
    sliced_iteration,
)
from topoctl.disco.search import Candidate, SearchResult, best_first, issue_order
from topoctl.disco.timeline import (
    cap_partition,
    mgwfbp_partition,
    optimal_partition,
    ready_times,
)
from topoctl.graph.cost import OpCost
from topoctl.graph.ops import OpGraph
from topoctl.sim.engine import simulate
from topoctl.sim.network import Network
from topoctl.sim.tasks import Collective, Compute, Task, previous

from . import PlanContext, Strategy, StrategyError, host_speeds, post_pass
from . import baseline as _baseline
from .sfb import plan_rates

MB = 1 << 20
CAPS_MB = (1, 5, 10, 25, 50, 100)
DDP_CAP, DDP_FIRST = 25 * MB, 1 * MB  # torch DDP's defaults (bucket_cap_mb=None)
BUDGET = 300  # simulations the search may spend
# one more torch optimizer.step() whose other parameters have no gradient: about 20-30 us
# for SGD on this CPU (ResNet-18's 62 parameters stepped one call each: 1.7 ms, one call 0.4 ms)
STEP_CALL_S = 25e-6
# the flatten's rate on gradients the backward has just written (not in cache): the lab's
# events, from a bucket's last gradient ready to its AllReduce started, 3.7 ms for the MLP's
# 15.9 MB and 4.0 ms for BERT's 16.8 MB (quiet, docs/results.md), against 1.2 ms at the runtime
# calibration's copy rate (13.5 GB/s, buffers in cache)
FLATTEN_BYTES_PER_S = 4.2e9
# the grid `slice_the_pick` scores on the search's pick (MiB per slice, slices of credit)
PICK_SLICE_MB = (1, 2, 4, 8, 16)
PICK_CREDIT_SLICES = (1, 2, 4)
OVERLAPS = ("backward", "forward")  # `bucket_overlap` (topocontract.buckets), default first
SEED = 0


@dataclass(frozen=True)
class Units:
    """The gradient units (parameters) in gradient-ready order: name, owning op, bytes, and the
    index of the owning op in backward order."""

    params: tuple[str, ...]
    ops: tuple[str, ...]
    size: tuple[int, ...]
    pos: tuple[int, ...]


def grad_units(graph: OpGraph) -> Units:
    """The graph's parameters in the order their gradients become ready."""
    back = {o.name: i for i, o in enumerate(reversed(graph.ops))}
    order = graph.gradient_order()
    return Units(tuple(p for _, p, _ in order), tuple(o for o, _, _ in order),
                 tuple(b for _, _, b in order), tuple(back[o] for o, _, _ in order))


def host_costs(ctx: PlanContext, options: dict[str, dict[str, OpCost]], fusion: str, host: str
               ) -> dict[str, OpCost]:
    """`host`'s per-op costs under fusion option `fusion` (module docstring)."""
    own = ctx.host_costs(host)
    if fusion == "none":
        return own
    ref, opt = options["none"], options[fusion]
    f = sum(c.fwd + c.bwd for c in opt.values()) / max(
        1e-12, sum(c.fwd + c.bwd for c in ref.values()))
    return {k: OpCost(v.fwd * f, v.bwd * f) for k, v in opt.items()}


def flatten_s(ctx: PlanContext, units: Units, first: int, last: int) -> float:
    """Seconds the runtime's main thread spends flattening the bucket of units `first..last`
    once its last gradient is ready (`topotrain.buckets`: each gradient divided into the
    bucket's buffer, one pass per parameter): per parameter the runtime's per-piece time plus
    its bytes at the copy rate of gradients fresh from the backward (`PlanContext.bucket_copy`:
    the calibrated copy rate, at most `FLATTEN_BYTES_PER_S`); 0 where the ranks' compute is not
    timed on this CPU. O(bucket units)."""
    if ctx.bucket_copy is None:
        return 0.0
    per_piece, rate = ctx.bucket_copy
    return (last - first + 1) * per_piece + sum(units.size[first:last + 1]) / min(
        rate, FLATTEN_BYTES_PER_S)


def _chunk_bounds(units: Units, cuts: tuple[int, ...], n_ops: int) -> list[tuple[int, int]]:
    """(last op in backward order, flatten units first..last or (0, -1)) per backward chunk:
    bucket k's chunk ends with its last unit's op and then flattens the bucket; the tail
    chunk (ops after the last bucket's) flattens nothing."""
    out, first = [], 0
    for last in cuts:
        out.append((units.pos[last], (first, last)))
        first = last + 1
    return out + [(n_ops - 1, (0, -1))]


def partition_tasks(ctx: PlanContext, units: Units, cuts: tuple[int, ...],
                    costs: Callable[[str], dict[str, OpCost]]) -> tuple[list[Task], list[int]]:
    """One iteration's tasks under the partition `cuts` (module docstring); (tasks, bucket
    bytes). `costs(host)`: that host's per-op costs."""
    algorithm, order, _ = _baseline.ring_collective(ctx, ctx.hosts)
    ops = list(reversed(ctx.graph.ops))
    # bucket k's chunk ends with its last op (backward order), then flattens the bucket
    bounds = _chunk_bounds(units, cuts, len(ops))
    tasks: list[Task] = []
    for h in ctx.hosts:
        c = costs(h)
        tasks.append(Compute(f"fwd@{h}", h, sum(c[o.name].fwd for o in ctx.graph.ops)))
        bwd = [c[o.name].bwd for o in ops]
        prev, first = f"fwd@{h}", 0
        for k, (end, (u0, u1)) in enumerate(bounds):
            tid = _baseline.backward_task(k, h)
            tasks.append(Compute(tid, h, sum(bwd[first:end + 1]) + flatten_s(ctx, units, u0, u1),
                                 (prev,)))
            prev, first = tid, max(first, end + 1)
    sizes, first = [], 0
    for last in cuts:
        sizes.append(sum(units.size[first:last + 1]))
        first = last + 1
    # gloo's asynchronous AllReduces, queued on the group's connections in issue order
    tasks += _baseline.bucket_allreduces(order, algorithm, sizes, [
        tuple(_baseline.backward_task(k, h) for h in ctx.hosts) for k in range(len(cuts))])
    every = tuple(f"ar{k}" for k in range(len(cuts)))
    for h in ctx.hosts:
        tasks.append(Compute(f"step@{h}", h, _baseline.step_time(ctx, h),
                             (_baseline.backward_task(len(cuts), h),) + every))
    return tasks, sizes


def step_call(ctx: PlanContext, host: str) -> float:
    """Seconds one more ``optimizer.step()`` call costs (forward overlap steps once per
    bucket): a kernel launch on a modelled device; on lab hosts `STEP_CALL_S`."""
    return STEP_CALL_S if ctx.step_s is not None else ctx.device[host].launch


def forward_chunks(ctx: PlanContext, units: Units, cuts: tuple[int, ...]
                   ) -> list[tuple[int, list[int]]]:
    """The forward pass split where a bucket is first needed: (index of the chunk's first op
    in forward order, the buckets its first op needs first), ascending; the first chunk starts
    at op 0 (needing none when the first ops own no parameters). O(units + buckets)."""
    need = dict(enumerate(bucket_reads(ctx, units, cuts)))
    starts = sorted(set(need.values()) | {0})
    return [(a, [k for k, f in need.items() if f == a]) for a in starts]


def overlap_tasks(ctx: PlanContext, units: Units, cuts: tuple[int, ...], tail: int,
                  costs: Callable[[str], dict[str, OpCost]], cycle: bool = False
                  ) -> tuple[list[Task], list[int], list[int]]:
    """One iteration's tasks under ``bucket_overlap: forward`` (`topotrain.buckets`); (tasks,
    bucket bytes and bucket indices, both in AllReduce order). The forward runs in chunks
    (`forward_chunks`): a chunk waits for the previous iteration's AllReduce of the buckets
    it needs first (`sim.tasks.previous`) and includes their share (by bytes) of the
    optimizer step and one `step_call` each; the backward runs in chunks as in
    `partition_tasks`; the AllReduces go one after another on one stream in `issue_order`,
    the first after the previous iteration's last. `steady_period` of these tasks is the
    iteration. `cycle`: instead one renewal cycle, from the backward's start (every bucket
    of the iteration before applied) to the end of the next forward, which waits for this
    backward's AllReduces: its simulated time is the period (exact when the hosts are
    alike), at the cost of one iteration. O(ops + buckets x hosts)."""
    order = issue_order(len(cuts), tail)
    ring, members, _ = _baseline.ring_collective(ctx, ctx.hosts)
    ready_sizes, first = [], 0
    for last in cuts:
        ready_sizes.append(sum(units.size[first:last + 1]))
        first = last + 1
    ar = (lambda k: (f"ar{k}",)) if cycle else (lambda k: (previous(f"ar{k}"),))  # noqa: E731
    tasks: list[Task] = []
    for h in ctx.hosts:
        fwd, bwd = _overlap_compute(ctx, units, cuts, ready_sizes, costs, h, ar)
        if cycle:  # the backward first, then the next forward
            bwd[0] = replace(bwd[0], deps=())
            fwd[0] = replace(fwd[0], deps=fwd[0].deps + (bwd[-1].id,))
            tasks += bwd + fwd
        else:
            tasks += fwd + bwd
    for j, k in enumerate(order):
        deps = tuple(_baseline.backward_task(k, h) for h in ctx.hosts)
        if j or not cycle:
            deps += (f"ar{order[j - 1]}",) if j else (previous(f"ar{order[-1]}"),)
        tasks.append(Collective(f"ar{k}", ring(members, float(ready_sizes[k])), deps))
    return tasks, [ready_sizes[k] for k in order], order


def bucket_reads(ctx: PlanContext, units: Units, cuts: tuple[int, ...]) -> list[int]:
    """Per bucket of the partition `cuts` (ready order): the index, in forward order, of the
    first op that reads one of its parameters. O(units)."""
    n_ops, first, out = len(ctx.graph.ops), 0, []
    for last in cuts:
        out.append(min(n_ops - 1 - units.pos[u] for u in range(first, last + 1)))
        first = last + 1
    return out


def slice_plan(ctx: PlanContext, units: Units, c: Candidate, model: dict
               ) -> tuple[list[list[int]], list[int], list[tuple[int, int]]]:
    """A sliced candidate's (slices' bytes per bucket, priority first-read-first, slices in
    the order the latency-bandwidth model sends them: `topoctl.disco.priority`) on the first
    host's costs. The runtime's parameters are float32: slices of whole 4-byte elements.
    O(S log S) for S slices."""
    sizes = _bucket_sizes(units, c.cuts)
    reads = bucket_reads(ctx, units, c.cuts)
    prio = sorted(range(len(sizes)), key=lambda k: (reads[k], -k))
    slices = [cut(s, c.slice_bytes) for s in sizes]
    costs = ctx.host_costs(ctx.hosts[0])
    fwd = [costs[o.name].fwd for o in ctx.graph.ops]
    need = [sum(fwd[:r]) for r in reads]
    ready = [model["ready"][last] for last in c.cuts]
    t = sliced_iteration(ready, need, slices, prio, c.credit, model["alpha"], model["beta"],
                         sum(fwd), model["bwd"])
    return slices, prio, list(t.sent)


def _bucket_sizes(units: Units, cuts: tuple[int, ...]) -> list[int]:
    out, first = [], 0
    for last in cuts:
        out.append(int(sum(units.size[first:last + 1])))
        first = last + 1
    return out


def sliced_tasks(ctx: PlanContext, units: Units, c: Candidate, model: dict,
                 costs: Callable[[str], dict[str, OpCost]], cycle: bool = False
                 ) -> tuple[list[Task], list[int], list[int]]:
    """One iteration's tasks of a sliced candidate (forward overlap, `slice_plan`): the
    forward and backward chunks of `overlap_tasks`, a forward chunk waiting for every slice
    of the buckets it reads first; one ring AllReduce ``ar<k>.<i>`` per slice in the model's
    sent order, each issued once its bucket is flattened on every host and the slices sent
    before it that the credit cannot also hold are done (gloo's asynchronous AllReduces
    queue on the group's connections, `baseline.bucket_allreduces`). (tasks, bucket bytes
    and bucket indices in ready order.) `cycle` as in `overlap_tasks`. O(ops + slices x
    hosts)."""
    slices, _, sent = slice_plan(ctx, units, c, model)
    sizes = _bucket_sizes(units, c.cuts)
    ring, members, _ = _baseline.ring_collective(ctx, ctx.hosts)
    ids = {k: tuple(f"ar{k}.{i}" for i in range(len(s))) for k, s in enumerate(slices)}
    ar = (lambda k: ids[k]) if cycle else (  # noqa: E731
        lambda k: tuple(previous(d) for d in ids[k]))
    tasks: list[Task] = []
    for h in ctx.hosts:
        fwd, bwd = _overlap_compute(ctx, units, c.cuts, sizes, costs, h, ar)
        if cycle:
            bwd[0] = replace(bwd[0], deps=())
            fwd[0] = replace(fwd[0], deps=fwd[0].deps + (bwd[-1].id,))
            tasks += bwd + fwd
        else:
            tasks += fwd + bwd
    tasks += _slice_collectives(ctx, slices, sent, c.credit, ring, members, cycle)
    return tasks, sizes, list(range(len(sizes)))


def _slice_collectives(ctx: PlanContext, slices: list[list[int]], sent: list[tuple[int, int]],
                       credit: int, ring, members, cycle: bool) -> list[Collective]:
    """The slices' AllReduces in sent order, each after its bucket's backward chunk on every
    host and after the latest earlier slice that, with those between, exceeds the credit."""
    out: list[Collective] = []
    held, lo = 0, 0
    for j, (k, i) in enumerate(sent):
        nbytes = slices[k][i]
        held += nbytes
        while lo < j and held > credit:  # slices lo..j do not fit in the credit together
            held -= slices[sent[lo][0]][sent[lo][1]]
            lo += 1
        deps = tuple(_baseline.backward_task(k, h) for h in ctx.hosts)
        if lo:  # slice lo-1 must be done before this one is issued
            deps += (f"ar{sent[lo - 1][0]}.{sent[lo - 1][1]}",)
        elif j == 0 and not cycle:  # after the previous iteration's last slice
            deps += (previous(f"ar{sent[-1][0]}.{sent[-1][1]}"),)
        out.append(Collective(f"ar{k}.{i}", ring(members, float(nbytes)), deps,
                              group=_baseline.GLOO_GROUP if ring is _baseline.ring_allreduce
                              else None))
    return out


def _overlap_compute(ctx: PlanContext, units: Units, cuts: tuple[int, ...],
                     ready_sizes: list[int], costs: Callable[[str], dict[str, OpCost]],
                     h: str, ar: Callable[[int], tuple[str, ...]]
                     ) -> tuple[list[Compute], list[Compute]]:
    """Host `h`'s forward chunks (each waiting for the tasks `ar(k)` of the buckets it needs
    first: the bucket's AllReduce, or its slices') and
    backward chunks (the first after the last forward chunk) of `overlap_tasks`."""
    ops, back = ctx.graph.ops, list(reversed(ctx.graph.ops))
    chunks = forward_chunks(ctx, units, cuts)
    bounds = [a for a, _ in chunks] + [len(ops)]
    total = max(1, sum(ready_sizes))
    c, step, call = costs(h), _baseline.step_time(ctx, h), step_call(ctx, h)
    fwd: list[Compute] = []
    prev: tuple[str, ...] = ()
    for j, (a, ks) in enumerate(chunks):
        dur = sum(c[o.name].fwd for o in ops[a:bounds[j + 1]]) + step * sum(
            ready_sizes[k] for k in ks) / total + call * len(ks)
        fwd.append(Compute(f"fwd{j}@{h}", h, dur, prev + tuple(d for k in ks for d in ar(k))))
        prev = (fwd[-1].id,)
    times, first, out = [c[o.name].bwd for o in back], 0, []
    for k, (end, (u0, u1)) in enumerate(_chunk_bounds(units, cuts, len(back))):
        out.append(Compute(_baseline.backward_task(k, h), h,
                           sum(times[first:end + 1]) + flatten_s(ctx, units, u0, u1), prev))
        prev, first = (out[-1].id,), max(first, end + 1)
    return fwd, out


def _network(ctx: PlanContext, base: Strategy) -> Network:
    """The base plan's network with the hosts' speeds, as the planner simulates it."""
    speeds = host_speeds(ctx)
    return replace(base.network, speed=speeds, _cache={}) if speeds else base.network


class _Scorer:
    """Simulated iteration of a candidate (memoised: the anchors and the search share it)."""

    def __init__(self, ctx: PlanContext, units: Units, network: Network,
                 options: dict[str, dict[str, OpCost]]):
        self.ctx, self.units, self.network, self.options = ctx, units, network, options
        self.memo: dict[Candidate, float] = {}
        self.model = model_inputs(ctx, units, network)  # sliced candidates' send order

    def tasks(self, c: Candidate, cycle: bool = False
              ) -> tuple[list[Task], list[int], list[int]]:
        """(tasks, bucket bytes, bucket indices), the last two in AllReduce order; `cycle`:
        forward overlap's renewal cycle (`overlap_tasks`)."""
        costs = lambda h: host_costs(self.ctx, self.options, c.fusion, h)  # noqa: E731
        if c.slice_bytes:
            return sliced_tasks(self.ctx, self.units, c, self.model, costs, cycle)
        if c.overlap == "forward":
            return overlap_tasks(self.ctx, self.units, c.cuts, c.tail, costs, cycle)
        tasks, sizes = partition_tasks(self.ctx, self.units, c.cuts, costs)
        return tasks, sizes, list(range(len(sizes)))

    def __call__(self, c: Candidate) -> float:
        if c not in self.memo:
            # forward overlap: iterations renew where a forward ends (every AllReduce of the
            # iteration before is applied): one cycle is the period (`overlap_tasks`)
            tasks = self.tasks(c, cycle=True)[0]
            self.memo[c] = simulate(tasks, self.network, record=False).iteration_time
        return self.memo[c]


def model_inputs(ctx: PlanContext, units: Units, network: Network) -> dict:
    """The latency-bandwidth model of the plan's ring (alpha s, beta s/byte, fitted on its
    network) and each unit's ready time on the first host (the anchors' model)."""
    (alpha, beta), _ = plan_rates(ctx, network)
    c = ctx.host_costs(ctx.hosts[0])
    back = list(reversed(ctx.graph.ops))
    op_ready, bwd = ready_times([c[o.name].bwd for o in back], [True] * len(back))
    return {"alpha": alpha, "beta": beta, "ready": [op_ready[p] for p in units.pos], "bwd": bwd}


def anchors(ctx: PlanContext, units: Units, score: _Scorer, model: dict
            ) -> dict[str, tuple[int, ...]]:
    """The anchors' partitions (module docstring), by name, for fusion option "none"."""
    size, n = list(units.size), len(units.size)
    a, b, ready = model["alpha"], model["beta"], model["ready"]
    out = {"ddp-default": cap_partition(size, DDP_CAP, DDP_FIRST),
           "job-cap": cap_partition(size, ctx.job.sync.bucket)}
    out |= {f"cap-{m}MB": cap_partition(size, m * MB) for m in CAPS_MB}
    out["mg-wfbp"] = mgwfbp_partition(ready, size, a, b)
    out["lb-optimum"] = optimal_partition(ready, size, a, b)
    out["one-bucket"] = (n - 1,)
    cap, _, _ = autotune_cap(lambda c: score(Candidate("none", cap_partition(size, c))))
    out["autotune"] = cap_partition(size, cap)
    return out


def sliced_anchors(ctx: PlanContext, units: Units, model: dict) -> dict[str, Candidate]:
    """The sliced anchors (forward overlap, one bucket per parameter as ByteScheduler
    schedules tensors, priority first-read-first): ``bytescheduler``, its default partition
    and credit (`BS_PARTITION_ELEMENTS`, `BS_CREDIT_ELEMENTS` of 4 bytes), and
    ``slicing-grid``, the best slice size and credit of the counted grid
    (`topoctl.disco.priority.search_slicing`) under the latency-bandwidth model. O(grid x
    S log S)."""
    per_unit = tuple(range(len(units.size)))
    costs = ctx.host_costs(ctx.hosts[0])
    fwd = [costs[o.name].fwd for o in ctx.graph.ops]
    need = [sum(fwd[:r]) for r in bucket_reads(ctx, units, per_unit)]
    grid = search_slicing(model["ready"], need, list(units.size), model["alpha"],
                          model["beta"], sum(fwd), model["bwd"])
    return {"bytescheduler": Candidate("none", per_unit, "forward", 1,
                                       BS_PARTITION_ELEMENTS * 4, BS_CREDIT_ELEMENTS * 4),
            "slicing-grid": Candidate("none", per_unit, "forward", 1, grid.slice_bytes,
                                      grid.credit)}


def slice_the_pick(result: SearchResult, score: Callable[[Candidate], float]
                   ) -> SearchResult:
    """`result` with its pick's partition and fusion sliced, when that is faster: every slice
    size of `PICK_SLICE_MB` MiB x credits of `PICK_CREDIT_SLICES` slices, forward overlap,
    priority first-read-first, scored by `score` (the simulator; counted: len(grid)
    evaluations more, ties to the unsliced pick, then the grid's order). The grid in the
    latency-bandwidth model (`sliced_anchors`) ranks candidates without the lab's
    per-message CPU; scoring the pick's own buckets in the simulator is what finds slices
    that pay there. O(grid) simulations."""
    c0 = replace(result.best, overlap="forward", tail=1)
    best, cost = result.best, result.cost
    for mb in PICK_SLICE_MB:
        for n in PICK_CREDIT_SLICES:
            c = replace(c0, slice_bytes=mb * MB, credit=n * mb * MB)
            t = score(c)
            if t < cost - 1e-12:
                best, cost = c, t
    grid = len(PICK_SLICE_MB) * len(PICK_CREDIT_SLICES)
    return replace(result, best=best, cost=cost, evaluations=result.evaluations + grid)


def tails(buckets: int) -> list[int]:
    """Held-back tails tried first for `buckets` buckets: 1, 2, 3, 4, 6, 8, 12, ... (each
    power of two and 1.5 times it) up to `buckets`, and `buckets`. O(log buckets)."""
    out, t = {1, buckets}, 2
    while t <= buckets:
        out |= {t, t + t // 2} if t + t // 2 <= buckets else {t}
        t *= 2
    return sorted(out)


def search(ctx: PlanContext, base: Strategy, options: dict[str, dict[str, OpCost]],
           budget: int = BUDGET, seed: int = SEED, progress: bool = True,
           forward: bool = True, slicing: bool = True) -> dict:
    """Anchors and DisCo's search on `base`'s network: a dict with the units, the scorer, the
    anchors' (partition, seconds), the sliced anchors' (candidate, seconds), the search
    result, the lower bound's parts and seconds. `forward`: the search may choose forward
    overlap (`bucket_overlap: forward`) too; `slicing` (with `forward`): and sliced buckets
    (`sliced_anchors`; off: the search of whole buckets, as before slicing)."""
    t0 = time.perf_counter()
    units = grad_units(ctx.graph)
    if not units.size:
        raise StrategyError("the model has no parameters to all-reduce")
    network = _network(ctx, base)
    score = _Scorer(ctx, units, network, options)
    model = score.model
    anchor = {k: (p, score(Candidate("none", p))) for k, p in
              anchors(ctx, units, score, model).items()}
    sliced = {k: (c, score(c)) for k, c in sliced_anchors(ctx, units, model).items()
              } if forward and slicing else {}
    ranked = [p for p, _ in sorted(anchor.values(), key=lambda x: x[1])]
    initial = [Candidate(f, p) for p in ranked for f in sorted(options)]
    if forward:  # forward overlap: one bucket per parameter and the best three anchors'
        # partitions, each with held-back tails on a geometric grid
        per_unit = tuple(range(len(units.size)))
        initial += [Candidate("none", p, "forward", t)
                    for p in dict.fromkeys([per_unit, *ranked[:3]]) for t in tails(len(p))]
        # the sliced anchors under every fusion option: slicing and fusion chosen jointly
        initial += [replace(c, fusion=f) for c, _ in sliced.values() for f in sorted(options)]

    def report(evals: int, best: float) -> None:  # progress, and the search's wall time
        print(f"disco: {evals}/{budget} simulations, best {best:.6f} s/it, "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    result = best_first(initial, len(units.size), sorted(options), score, seed=seed,
                        budget=max(budget, len(initial)), progress=report if progress else None,
                        overlaps=OVERLAPS if forward else OVERLAPS[:1])
    if sliced:  # the pick's own buckets sliced: a counted grid scored by the simulator
        result = slice_the_pick(result, score)
    if progress:
        print(f"disco: searched {result.evaluations} candidates in "
              f"{time.perf_counter() - t0:.1f} s (anchors included)", file=sys.stderr)
    return {"units": units, "score": score, "model": model, "anchors": anchor,
            "sliced": sliced, "result": result,
            "seconds": time.perf_counter() - t0}


def ideal(ctx: PlanContext, units: Units, score: _Scorer) -> tuple[float, float]:
    """(T_compute, T_comm): the iteration without any AllReduce (compute alone) and one
    AllReduce of every gradient alone, both simulated on the plan's network."""
    c = Candidate("none", (len(units.size) - 1,))
    tasks = score.tasks(c)[0]
    compute = [t for t in tasks if isinstance(t, Compute) and not t.communication]
    ids = {t.id for t in compute}
    compute = [replace(t, deps=tuple(d for d in t.deps if d in ids)) for t in compute]
    t_compute = simulate(compute, score.network, record=False).iteration_time
    ar = [t for t in tasks if isinstance(t, Collective)]
    t_comm = simulate([replace(ar[0], deps=())], score.network, record=False).iteration_time
    return t_compute, t_comm


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def with_disco(ctx: PlanContext, base: Strategy,
               fusion_options: dict[str, dict[str, OpCost]] | None = None,
               budget: int = BUDGET, seed: int = SEED) -> Strategy:
    """`base` (a data-parallel ring plan, even batches, no SFB) with the buckets (and fusion
    option) DisCo's search picks: tasks rebuilt, the bucket plan in its collective, the
    anchors, search and gap figures in its notes."""
    if base.collective.get("algorithm") != "ring" or {"shares", "sfb"} & set(base.collective):
        raise StrategyError(f"DisCo's buckets are planned on data-parallel ring plans with even "
                            f"batches and no SFB (not {base.name})")
    options = fusion_options or {"none": ctx.host_costs(ctx.hosts[0])}
    found = search(ctx, base, options, budget, seed)
    units, score, res = found["units"], found["score"], found["result"]
    tasks, sizes, order = score.tasks(res.best)
    t_compute, t_comm = ideal(ctx, units, score)
    t_default = found["anchors"]["ddp-default"][1]
    gap = t_default - max(t_compute, t_comm)
    plan = bucket_plan(units, res.best.cuts, order)
    collective = base.collective | {"bucket_plan": plan}
    if res.best.overlap == "forward":  # the default (backward) is not written: same bytes
        collective |= {"bucket_overlap": "forward"}
    slicing = {}
    if res.best.slice_bytes:  # ByteScheduler's schedule: slices, priority, credit
        _, prio, _ = slice_plan(ctx, units, res.best, found["model"])
        slicing = {"slice_bytes": res.best.slice_bytes, "priority": prio,
                   "credit": res.best.credit}
        collective |= {"bucket_slicing": slicing}
    notes = dict(base.notes) | {"disco": {
        "fusion": res.best.fusion, "buckets": len(sizes), "overlap": res.best.overlap,
        "tail": res.best.tail,
        **({"slicing": {k: slicing[k] for k in ("slice_bytes", "credit")}} if slicing else {}),
        "anchors": {k: _r(t) for k, (_, t) in found["anchors"].items()} | {
            k: _r(t) for k, (_, t) in found["sliced"].items()},
        "t_compute": _r(t_compute), "t_comm": _r(t_comm),
        "gap_closed": _r((t_default - res.cost) / gap) if gap > 0 else None,
        "search": {"simulations": res.evaluations, "expansions": res.expansions,
                   "kept": len(res.kept), "seed": seed}}}  # no seconds: plans are the same bytes
    return replace(base, name=f"{base.name}+disco", tasks=tasks, buckets=sizes,
                   collective=collective, notes=notes)


def bucket_plan(units: Units, cuts: tuple[int, ...], order: list[int]) -> list[dict]:
    """The plan's ``bucket_plan``: the buckets of the partition `cuts` (parameter names and
    bytes) listed in AllReduce `order`. O(units)."""
    buckets, first = [], 0
    for last in cuts:
        buckets.append({"params": list(units.params[first:last + 1]),
                        "bytes": int(sum(units.size[first:last + 1]))})
        first = last + 1
    return [buckets[k] for k in order]


@post_pass("disco", applies_to=("baseline",))
def disco_pass(ctx: PlanContext, base: Strategy) -> Strategy:
    """`base` (the baseline) with DisCo's buckets and operator fusion chosen together."""
    costs = ctx.host_costs(ctx.hosts[0])
    # ranks timed on this CPU (a lab): the learned model prices a fused region; otherwise the
    # roofline of the device the costs were modelled on
    device = None if ctx.cpu_pool is not None else ctx.device[ctx.hosts[0]]
    s = with_disco(ctx, base, fusion_options(ctx.graph, costs, device=device, dtype=ctx.job.dtype))
    chosen = fusion_plan(ctx.graph, costs, s.notes["disco"]["fusion"])
    if chosen.mode == "none":
        return s
    return replace(s, collective=s.collective | {"fusion": chosen.to_dict()})
