"""Plan-named gradient buckets at run time (`topocontract.buckets`: the plan names them).

    run = attach_buckets(model, plan, algorithm="ring")       # before the first backward
    loss.backward()                                            # buckets start inside it
    run.finish()                                               # wait, average into p.grad
    run.take_events()   # [[bucket, bytes, ready_s, start_s, end_s], ...] in start order

Every parameter gets a post-accumulate-grad hook. When the last gradient of bucket k is ready
and bucket k-1 has started, bucket k is flattened into its buffer (allocated once and reused;
each gradient divided by the world size on the way in, as DDP does, so the average equals
DDP's) and its AllReduce starts
asynchronously: gloo's ring (``dist.all_reduce(async_op=True)``) or the plan's packed trees
(`topotrain.collectives.tree_allreduce`, on one background thread, buckets one after another).
Buckets start in the plan's order on every rank, which is what matches the collectives up.
`finish` starts any bucket whose gradients never came (parameters unused this iteration: zero
gradients, as DDP with ``find_unused_parameters`` would reduce), waits for every bucket and
copies the averages back into the gradients. No DDP wrapper: the model is used as is (the
trainer checks the ranks built the same weights).

With ``bucket_overlap: forward`` (cross-iteration overlap: Peng et al., "A Generic
Communication Scheduler for Distributed DNN Training Acceleration" (ByteScheduler), SOSP'19;
Bao et al., "Preemptive All-reduce Scheduling for Expediting Distributed DNN Training"
(PACE), INFOCOM'20) the runtime owns the optimizer step (``attach_buckets(...,
optimizer=opt)``)::

    out = model(x)         # each module first waits for its parameters' buckets, steps them
    loss.backward()        # buckets start inside it (their local gradients then dropped)
    run.finish()           # starts what has not started; does not wait
    ...
    run.flush()            # after the last iteration, before a checkpoint or any weight read

Every AllReduce runs on one background thread, buckets one after another in the plan's
order (ring: gloo's blocking all_reduce there; trees as above), as the simulator models one
communication stream. A forward pre-hook on each module that owns parameters (on a fused
region's module for all of the region's: its compiled code is not entered) waits for the
buckets holding them, writes the averages into the gradients, runs ``optimizer.step()`` with
only those gradients set (torch's optimizers skip parameters without a gradient, and keep
their state, Adam's step count included, per parameter: the update is exactly the
synchronous one) and clears them; a hook after the model's forward applies whatever is left
(parameters the forward did not reach), so the next backward never finds a bucket in flight.
Parameters read by a module that runs before their owner (a weight tied the other way round)
would be read stale: the catalog's models do not. The events of a bucket then also say where
it was applied (`take_events`). Cost per iteration: O(parameters x buckets) for the steps.

With ``bucket_slicing`` (`topocontract.slicing`) a bucket is flattened as soon as its
gradients are ready, whatever its place in the list, and handed to the slice scheduler
(`topotrain.priority`): its slices are all-reduced by priority within the plan's credit, on a
thread of their own, ring or trees, in either overlap mode; a bucket is waited for (and, with
forward overlap, applied) once its own slices are done (`take_slice_events`).

Times in the events are seconds since the first gradient of the iteration was ready.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from topocontract.buckets import bucket_overlap_of, bucket_plan_of
from topocontract.slicing import slice_counts, slicing_of
from topotrain.priority import SliceScheduler

__all__ = ["PlannedBuckets", "attach_buckets"]


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    pending: int = 0
    buf: torch.Tensor | None = None
    work: Any = None  # gloo Work (ring) or a Future (trees, and every forward-overlap bucket)
    ready: float = 0.0
    start: float = 0.0
    end: float = 0.0
    t0: float = 0.0  # its iteration's first ready gradient (forward overlap: events later)
    flat: torch.Tensor | None = None  # the bucket's buffer, allocated once (`_flatten`)


def _flatten(b: _Bucket, world: int) -> torch.Tensor:
    """Bucket `b`'s gradients, each divided by `world` (as DDP pre-divides), written into the
    bucket's own flat buffer (allocated on first use, then reused: a fresh buffer per iteration
    costs the page faults of its first touch, measured 4-9 ms per iteration for the MLP's 15.9 MB
    against 1.5 ms reused) in one pass per parameter (the division writes the buffer: no separate
    copy); a parameter without a gradient contributes zeros. The averages are later viewed as
    the gradients (`PlannedBuckets._wait`), so the buffer is only rewritten after the
    optimizer step that read them. O(bucket bytes)."""
    if b.flat is None:
        first = b.params[0]
        b.flat = torch.empty(sum(p.numel() for p in b.params), dtype=first.dtype,
                             device=first.device)
    off = 0
    for p in b.params:
        n = p.numel()
        out = b.flat[off:off + n]
        if p.grad is None:
            out.zero_()
        else:
            torch.div(p.grad.reshape(-1), world, out=out)
        off += n
    return b.flat


@dataclass
class PlannedBuckets:
    """One rank's plan-named buckets (`attach_buckets` builds it and hooks the parameters)."""

    buckets: list[_Bucket]
    algorithm: str = "ring"
    schedule: Any = None  # a TreeSchedule for `trees`
    group: Any = None
    world: int = 1
    next: int = 0  # the next bucket to start
    t0: float | None = None
    events: list[list] = field(default_factory=list)
    executor: ThreadPoolExecutor | None = None
    owner: dict[int, int] = field(default_factory=dict)  # id(param) -> bucket index
    overlap: str = "backward"  # `bucket_overlap`: forward = applied in the next forward
    optimizer: Any = None  # forward overlap: stepped per bucket by the runtime
    in_flight: set[int] = field(default_factory=set)  # forward overlap: started, not applied
    f0: float = 0.0  # when the current forward started (forward overlap's events)
    slices: SliceScheduler | None = None  # `bucket_slicing`: sliced, by priority, a credit

    def _ready(self, p: torch.nn.Parameter) -> None:
        """A gradient is accumulated: count it down; start every bucket now startable."""
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        k = self.owner[id(p)]
        b = self.buckets[k]
        b.pending -= 1
        if b.pending == 0:
            b.ready = now
        if self.slices is not None:  # the scheduler orders the slices: start when ready
            if b.pending == 0:
                self._start(k)
            return
        while self.next < len(self.buckets) and self.buckets[self.next].pending == 0:
            self._start(self.next)
            self.next += 1

    def _start(self, k: int) -> None:
        """Flatten bucket `k` (gradients pre-divided by the world size) and start its
        AllReduce (forward overlap: on the one communication thread, the local gradients
        dropped: the average comes back in the next forward)."""
        b = self.buckets[k]
        b.buf = _flatten(b, self.world)
        b.start, b.t0 = time.perf_counter(), self.t0
        if self.overlap == "forward":
            for p in b.params:
                p.grad = None
            self.in_flight.add(k)
        if self.slices is not None:
            self.slices.ready(k, b.buf)
        elif self.executor is not None:  # trees, or forward overlap: one bucket after another
            b.work = self.executor.submit(self._reduce, b)
        else:
            b.work = dist.all_reduce(b.buf, group=self.group, async_op=True)
            b.work.get_future().then(lambda _f, b=b: setattr(b, "end", time.perf_counter()))

    def _reduce(self, b: _Bucket) -> None:
        """Bucket `b`'s AllReduce, blocking, on the communication thread."""
        if self.algorithm == "trees":
            from topotrain.collectives import tree_allreduce  # torch-heavy: trees plans only

            tree_allreduce(b.buf, self.schedule, self.group)
        else:
            dist.all_reduce(b.buf, group=self.group)
        b.end = time.perf_counter()

    def _start_rest(self) -> None:
        """Start what has not started (parameters without a gradient this iteration)."""
        if self.t0 is None:
            self.t0 = time.perf_counter()
        if self.slices is not None:  # every bucket not started yet, whatever its place
            for k, b in enumerate(self.buckets):
                if b.pending:
                    b.ready, b.pending = time.perf_counter(), 0
                    self._start(k)
            return
        for b in self.buckets[self.next:]:
            if b.pending:
                b.ready = time.perf_counter()
                b.pending = 0
        while self.next < len(self.buckets):
            self._start(self.next)
            self.next += 1

    def _wait(self, k: int) -> None:
        """Wait for bucket `k`'s AllReduce; its averages viewed as the parameters' gradients."""
        b = self.buckets[k]
        if self.slices is not None:
            b.end = self.slices.wait(k)
        elif isinstance(b.work, Future):
            b.work.result()
        else:
            b.work.wait()
        b.end = b.end or time.perf_counter()
        off = 0
        for p in b.params:
            n = p.numel()
            p.grad = b.buf[off:off + n].view_as(p)  # the average, viewed: no copy
            off += n

    def _event(self, k: int) -> list:
        b = self.buckets[k]
        return [k, b.buf.numel() * b.buf.element_size(), round(b.ready - b.t0, 6),
                round(b.start - b.t0, 6), round(b.end - b.t0, 6)]

    def _reset(self, k: int) -> None:
        b = self.buckets[k]
        b.pending, b.work, b.buf, b.end = len(b.params), None, None, 0.0
        if self.slices is not None:
            self.slices.reset(k)

    def finish(self) -> None:
        """After the backward: start what has not started (unused parameters); then wait for
        every bucket in order, write the averaged gradients back and reset for the next
        iteration. Forward overlap: start only, the next forward (or `flush`) waits."""
        self._start_rest()
        if self.overlap != "forward":
            for k in range(len(self.buckets)):
                self._wait(k)
                self.events.append(self._event(k))
                self._reset(k)
        self.next, self.t0 = 0, None

    def apply(self, ks: list[int], where: str = "forward") -> None:
        """Forward overlap: wait for the buckets `ks` still in flight and step the optimizer
        on exactly their parameters (the others have no gradient), in ascending order. The
        event: the bucket's five fields, `where` (forward or flush), and the wait's start and
        end in seconds since the forward started (flush: since `flush` was called)."""
        for k in sorted(set(ks) & self.in_flight):
            w0 = time.perf_counter()
            self._wait(k)
            self.optimizer.step()
            b = self.buckets[k]
            for p in b.params:
                p.grad = None
            self.events.append([*self._event(k), where, round(w0 - self.f0, 6),
                                round(time.perf_counter() - self.f0, 6)])
            self.in_flight.discard(k)
            self._reset(k)

    def flush(self) -> None:
        """Forward overlap: apply every bucket in flight (after the last iteration, before a
        checkpoint or any read of the weights). Nothing to do in the default mode."""
        self.f0 = time.perf_counter()
        self.apply(sorted(self.in_flight), "flush")

    def take_slice_events(self) -> list[list]:
        """With ``bucket_slicing``: the slices' events since the last call, in the order sent
        (`topotrain.priority`); [] otherwise."""
        return self.slices.take_events() if self.slices is not None else []

    def take_events(self) -> list[list]:
        """[bucket index, bytes, ready s, start s, end s] per bucket since the last call, in the
        order they started (the plan's order); and forget them. Forward overlap: per bucket
        applied since the last call (the previous iteration's, applied in this forward, and
        after a `flush` this one's), in the order applied, with three more fields (`apply`)."""
        out, self.events = self.events, []
        return out


def _hook_points(model: torch.nn.Module, regions: tuple[str, ...]
                 ) -> list[tuple[torch.nn.Module, list[torch.nn.Parameter]]]:
    """(module, the parameters it must have applied before it runs): a fused region's module
    with all of the region's parameters, every other module with its own. O(modules)."""
    out = []
    for path, m in model.named_modules():
        inside = [r for r in regions if r == "" or path == r or path.startswith(r + ".")]
        if inside and path not in regions:
            continue  # inside a compiled region: its region's hook covers it
        params = [p for p in (m.parameters() if path in regions else
                              m.parameters(recurse=False)) if p.requires_grad]
        if params:
            out.append((m, params))
    return out


def _hook_forward(run: PlannedBuckets, model: torch.nn.Module, regions: tuple[str, ...]
                  ) -> None:
    """Forward overlap's hooks: the forward's start time, one pre-hook per hook point, and
    the leftovers applied after the model's forward."""
    def started(_m, _args) -> None:
        run.f0 = time.perf_counter()

    model.register_forward_pre_hook(started, prepend=True)
    for m, params in _hook_points(model, regions):
        ks = sorted({run.owner[id(p)] for p in params})
        m.register_forward_pre_hook(lambda _m, _args, ks=ks: run.apply(ks))
    model.register_forward_hook(lambda _m, _args, _out: run.apply(sorted(run.in_flight)))


def attach_buckets(model: torch.nn.Module, collective: dict, group: Any = None,
                   schedule: Any = None, optimizer: Any = None,
                   regions: tuple[str, ...] = ()) -> PlannedBuckets:
    """Hook `model`'s parameters for the bucket plan of `collective` (the plan's
    ``job.collective``: `bucket_plan`, `algorithm`, `bucket_overlap`); BucketPlanError (YAML
    paths) when the plan does not name the model's trainable parameters exactly once.
    `schedule`: the tree schedule for ``algorithm: trees``. Forward overlap: `optimizer`
    (over the model's parameters, stepped by the runtime) is required and `regions` are the
    module paths compiled as one (`topotrain.fusion`)."""
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    plan = bucket_plan_of(collective, list(named))
    overlap = bucket_overlap_of(collective)
    if overlap == "forward" and optimizer is None:
        raise ValueError("bucket_overlap: forward needs the optimizer: the runtime steps it")
    algorithm = collective.get("algorithm", "ring")
    run = PlannedBuckets([_Bucket([named[n] for n in names], len(names)) for names in plan],
                         algorithm, schedule, group, dist.get_world_size(group),
                         overlap=overlap, optimizer=optimizer)
    slicing = slicing_of(collective)
    if slicing is not None:  # one thread of its own schedules the slices
        run.slices = SliceScheduler(
            [slice_counts(slicing, k, sum(p.numel() for p in b.params),
                          b.params[0].element_size()) for k, b in enumerate(run.buckets)],
            [b.params[0].element_size() for b in run.buckets], slicing, group, algorithm,
            schedule)
    elif algorithm == "trees" or overlap == "forward":
        # one thread: buckets reduced one after another in the plan's order on every rank
        run.executor = ThreadPoolExecutor(1, thread_name_prefix="bucket-comm")
    for k, b in enumerate(run.buckets):
        for p in b.params:
            run.owner[id(p)] = k
            p.register_post_accumulate_grad_hook(run._ready)
    if overlap == "forward":
        _hook_forward(run, model, regions)
    return run
