"""Plan-named gradient buckets at run time (`topocontract.buckets`: the plan names them).

    run = attach_buckets(model, plan, algorithm="ring")       # before the first backward
    loss.backward()                                            # buckets start inside it
    run.finish()                                               # wait, average into p.grad
    run.take_events()   # [[bucket, bytes, ready_s, start_s, end_s], ...] in start order

Every parameter gets a post-accumulate-grad hook. When the last gradient of bucket k is ready
and bucket k-1 has started, bucket k is flattened into one buffer (each gradient divided by
the world size first, as DDP does, so the average equals DDP's) and its AllReduce starts
asynchronously: gloo's ring (``dist.all_reduce(async_op=True)``) or the plan's packed trees
(`topotrain.collectives.tree_allreduce`, on one background thread, buckets one after another).
Buckets start in the plan's order on every rank, which is what matches the collectives up.
`finish` starts any bucket whose gradients never came (parameters unused this iteration: zero
gradients, as DDP with ``find_unused_parameters`` would reduce), waits for every bucket and
copies the averages back into the gradients. No DDP wrapper: the model is used as is (the
trainer checks the ranks built the same weights).

Times in the events are seconds since the first gradient of the iteration was ready.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from topocontract.buckets import bucket_plan_of

__all__ = ["PlannedBuckets", "attach_buckets"]


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    pending: int = 0
    buf: torch.Tensor | None = None
    work: Any = None  # gloo Work (ring) or a Future (trees)
    ready: float = 0.0
    start: float = 0.0
    end: float = 0.0


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

    def _ready(self, p: torch.nn.Parameter) -> None:
        """A gradient is accumulated: count it down; start every bucket now startable."""
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        b = self.buckets[self.owner[id(p)]]
        b.pending -= 1
        if b.pending == 0:
            b.ready = now
        while self.next < len(self.buckets) and self.buckets[self.next].pending == 0:
            self._start(self.next)
            self.next += 1

    def _start(self, k: int) -> None:
        """Flatten bucket `k` (gradients pre-divided by the world size) and start its
        AllReduce."""
        b = self.buckets[k]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in b.params]
        b.buf = torch.cat([g.reshape(-1) for g in grads]).div_(self.world)
        b.start = time.perf_counter()
        if self.algorithm == "trees":
            from topotrain.collectives import tree_allreduce  # torch-heavy: trees plans only

            def run(buf=b.buf, b=b) -> None:
                tree_allreduce(buf, self.schedule, self.group)
                b.end = time.perf_counter()

            b.work = self.executor.submit(run)
        else:
            b.work = dist.all_reduce(b.buf, group=self.group, async_op=True)
            b.work.get_future().then(lambda _f, b=b: setattr(b, "end", time.perf_counter()))

    def finish(self) -> None:
        """After the backward: start what has not started (unused parameters), wait for every
        bucket in order, write the averaged gradients back and reset for the next iteration."""
        if self.t0 is None:
            self.t0 = time.perf_counter()
        for b in self.buckets[self.next:]:
            if b.pending:
                b.ready = time.perf_counter()
                b.pending = 0
        while self.next < len(self.buckets):
            self._start(self.next)
            self.next += 1
        for k, b in enumerate(self.buckets):
            if isinstance(b.work, Future):
                b.work.result()
            else:
                b.work.wait()
            b.end = b.end or time.perf_counter()
            off = 0
            for p in b.params:
                n = p.numel()
                p.grad = b.buf[off:off + n].view_as(p)  # the average, viewed: no copy
                off += n
            self.events.append([k, b.buf.numel() * b.buf.element_size(),
                                round(b.ready - self.t0, 6), round(b.start - self.t0, 6),
                                round(b.end - self.t0, 6)])
            b.pending, b.work, b.buf, b.end = len(b.params), None, None, 0.0
        self.next, self.t0 = 0, None

    def take_events(self) -> list[list]:
        """[bucket index, bytes, ready s, start s, end s] per bucket since the last call, in the
        order they started (the plan's order); and forget them."""
        out, self.events = self.events, []
        return out


def attach_buckets(model: torch.nn.Module, collective: dict, group: Any = None,
                   schedule: Any = None) -> PlannedBuckets:
    """Hook `model`'s parameters for the bucket plan of `collective` (the plan's
    ``job.collective``: `bucket_plan`, `algorithm`); BucketPlanError (YAML paths) when the
    plan does not name the model's trainable parameters exactly once. `schedule`: the tree
    schedule for ``algorithm: trees``."""
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    plan = bucket_plan_of(collective, list(named))
    algorithm = collective.get("algorithm", "ring")
    run = PlannedBuckets([_Bucket([named[n] for n in names], len(names)) for names in plan],
                         algorithm, schedule, group, dist.get_world_size(group))
    if algorithm == "trees":
        # one thread: buckets reduced one after another in the plan's order on every rank
        run.executor = ThreadPoolExecutor(1, thread_name_prefix="bucket-trees")
    for k, b in enumerate(run.buckets):
        for p in b.params:
            run.owner[id(p)] = k
            p.register_post_accumulate_grad_hook(run._ready)
    return run
