"""Sliced gradient buckets all-reduced by priority with a credit (`topocontract.slicing`:
the plan's ``job.collective.bucket_slicing``), as ByteScheduler schedules them (Peng et al.,
"A Generic Communication Scheduler for Distributed DNN Training Acceleration", SOSP'19).

`topotrain.buckets.PlannedBuckets` flattens a bucket once its gradients are ready and hands
the buffer to `SliceScheduler.ready`; the buffer's slices are then all-reduced by one
communication thread:

    while slices of this iteration are not done:
        agree      the slices ready on every rank (a MIN AllReduce of the ready flags on a
                   control group of the same ranks: the ranks must issue the same slices in
                   the same order, and each knows only its own readiness)
        issue      agreed-ready slices not yet sent, highest-priority bucket first (its
                   slices in order), while the bytes in flight stay <= credit (one slice is
                   always allowed); stop at the first that does not fit (strict priority)
        wait       the oldest slice in flight (its credit returns), or, with nothing in
                   flight, for this rank's readiness to change

Every decision depends only on the agreed flags and the slices waited for, so every rank
issues the same sequence (and the same number of agreements). A slice readied after others
were queued but of a higher priority goes before them at the next agreement: the overtaking
ByteScheduler's priority queue does. Ring: ``dist.all_reduce(async_op=True)`` on the data
group, up to the credit in flight; trees: the plan's packed trees
(`topotrain.collectives.tree_allreduce`), blocking, one slice per agreement.

`wait(k)` returns once every slice of bucket k is done, so the next forward of a layer waits
only for its own bucket's slices (`topotrain.buckets`, forward overlap). The events
(`take_events`) record, in the order sent: [bucket, slice, bytes, agreement at which it was
first ready on every rank, agreement at which it was sent, start s, end s] (seconds since
the iteration's first ready bucket): a reader checks the priority from them.
Cost per agreement: one AllReduce of 4 bytes per slice on the control group; agreements
stop once every slice of the iteration was agreed ready (what is left is then decided).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from topocontract.slicing import Slicing

__all__ = ["SliceScheduler"]


@dataclass(frozen=True)
class _Slice:
    bucket: int
    index: int  # within its bucket
    lo: int  # element range of the bucket's flat buffer
    hi: int
    nbytes: int
    rank: int  # its bucket's place in the priority order (0 = first)


@dataclass
class _Round:
    """The communication thread's state for one iteration."""

    sent: set[int] = field(default_factory=set)
    first_ready: dict[int, int] = field(default_factory=dict)  # slice -> agreement number
    inflight: deque = field(default_factory=deque)  # (slice, work, start s, agreement)
    inflight_bytes: int = 0
    remaining: int = 0
    agreements: int = 0


class SliceScheduler:
    """One rank's priority scheduler of the plan's slices (module docstring)."""

    def __init__(self, counts: list[list[int]], element: list[int], slicing: Slicing,
                 group: Any = None, algorithm: str = "ring", schedule: Any = None):
        rank = slicing.rank()
        self.slices: list[_Slice] = []
        for k, sizes in enumerate(counts):
            lo = 0
            for i, n in enumerate(sizes):
                self.slices.append(_Slice(k, i, lo, lo + n, n * element[k], rank[k]))
                lo += n
        # the issue order among agreed-ready slices: bucket priority, then slice order
        self.order = sorted(range(len(self.slices)),
                            key=lambda s: (self.slices[s].rank, self.slices[s].index))
        self.of_bucket = [[s for s, x in enumerate(self.slices) if x.bucket == k]
                          for k in range(len(counts))]
        self.credit, self.group = slicing.credit, group
        self.algorithm, self.schedule = algorithm, schedule
        ranks = list(range(dist.get_world_size())) if group is None else \
            dist.get_process_group_ranks(group)
        self.control = dist.new_group(ranks)  # agreements never queue behind slices
        self.flags = torch.zeros(len(self.slices), dtype=torch.int32)  # locally ready
        self.bufs: list[torch.Tensor | None] = [None] * len(counts)
        self.left = [len(s) for s in self.of_bucket]  # slices not done, per bucket
        self.end = [0.0] * len(counts)
        self.cv = threading.Condition()
        self.version = 0  # bumped on every local readiness change
        self.generation = 0  # iterations begun on this rank (a first ready bucket)
        self.t0: float | None = None
        self.events: list[list] = []
        threading.Thread(target=self._serve, name="slice-comm", daemon=True).start()

    def ready(self, k: int, buf: torch.Tensor) -> None:
        """Bucket `k`'s flat buffer (its gradients, pre-divided) is ready on this rank."""
        with self.cv:
            if self.t0 is None:  # the iteration's first bucket: the thread may begin it
                self.t0 = time.perf_counter()
                self.generation += 1
            self.bufs[k] = buf
            self.flags[self.of_bucket[k]] = 1
            self.version += 1
            self.cv.notify_all()

    def wait(self, k: int) -> float:
        """Wait until every slice of bucket `k` is all-reduced; when the last one ended."""
        with self.cv:
            self.cv.wait_for(lambda: self.left[k] == 0)
            return self.end[k]

    def reset(self, k: int) -> None:
        """Bucket `k` consumed: ready for the next iteration."""
        with self.cv:
            self.flags[self.of_bucket[k]] = 0
            self.left[k] = len(self.of_bucket[k])
            self.bufs[k] = None
            if all(b is None for b in self.bufs):
                self.t0 = None

    def take_events(self) -> list[list]:
        """The slices' events since the last call, in the order sent (module docstring)."""
        with self.cv:
            out, self.events = self.events, []
        return out

    def _serve(self) -> None:
        """The communication thread: one iteration after another."""
        served = 0
        while True:
            with self.cv:  # not the flags: the last iteration's may not be reset yet
                self.cv.wait_for(lambda n=served: self.generation > n)
            served += 1
            self._iteration(_Round(remaining=len(self.slices)))

    def _iteration(self, r: _Round) -> None:
        """Agree, issue, wait until every slice of the iteration is done."""
        everything = torch.ones(len(self.slices), dtype=torch.int32)
        while r.remaining:
            with self.cv:
                snap, version = self.flags.clone(), self.version
            if len(r.first_ready) < len(self.slices):  # once every slice was agreed ready,
                # what is left to decide depends on nothing more: no more agreements
                dist.all_reduce(snap, op=dist.ReduceOp.MIN, group=self.control)
                r.agreements += 1
            else:
                snap = everything
            issued = self._issue(r, snap)
            if r.inflight:
                self._complete(r)
            elif not issued:  # nothing agreed to send: wait for this rank to change, unless
                # it has everything ready already (then the others are behind: agree again)
                with self.cv:
                    self.cv.wait_for(lambda v=version: self.version != v or all(
                        self.flags[s] or s in r.sent for s in range(len(self.slices))),
                        timeout=0.05)

    def _issue(self, r: _Round, agreed: torch.Tensor) -> bool:
        """Start the agreed-ready slices in priority order within the credit; any started."""
        issued = False
        for s in agreed.nonzero().flatten().tolist():
            r.first_ready.setdefault(s, r.agreements)
        for s in self.order:
            if s in r.sent or not agreed[s]:
                continue
            x = self.slices[s]
            blocking = self.algorithm == "trees"
            if r.inflight and (blocking or r.inflight_bytes + x.nbytes > self.credit):
                break  # strict priority: nothing of lower priority jumps the queue
            if blocking and issued:
                break
            r.sent.add(s)
            view = self.bufs[x.bucket][x.lo:x.hi]
            start = time.perf_counter()
            if blocking:
                from topotrain.collectives import tree_allreduce  # torch-heavy: trees only

                tree_allreduce(view, self.schedule, self.group)
                work = None
            else:
                work = dist.all_reduce(view, group=self.group, async_op=True)
            r.inflight.append((s, work, start, r.agreements))
            r.inflight_bytes += x.nbytes
            issued = True
        return issued

    def _complete(self, r: _Round) -> None:
        """Wait for the oldest slice in flight; its bucket done when it was the last."""
        s, work, start, sent = r.inflight.popleft()
        if work is not None:
            work.wait()
        end = time.perf_counter()
        x = self.slices[s]
        r.inflight_bytes -= x.nbytes
        r.remaining -= 1
        with self.cv:
            t0 = self.t0 if self.t0 is not None else start
            self.events.append([x.bucket, x.index, x.nbytes, r.first_ready[s], sent,
                                round(start - t0, 6), round(end - t0, 6)])
            self.left[x.bucket] -= 1
            if self.left[x.bucket] == 0:
                self.end[x.bucket] = end
            self.cv.notify_all()

