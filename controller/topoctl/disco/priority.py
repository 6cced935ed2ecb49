"""Tensor partitioning and priority scheduling with a credit: the bucket timeline of one
data-parallel iteration whose buckets are cut into slices (`topocontract.slicing`), as
ByteScheduler schedules them (Peng et al., "A Generic Communication Scheduler for Distributed
DNN Training Acceleration", SOSP'19), and a small counted search over slice size and credit.

Plain data, no I/O. Buckets are numbered in the plan's list order; ``ready[k]`` is when bucket
k's gradients are all ready (seconds after the backward starts), ``need[k]`` when the next
forward first needs it (seconds of forward compute before the first op that reads it),
``slices[k]`` its slices' bytes, ``priority`` the bucket indices highest first. An AllReduce
of S bytes costs ``alpha + beta * S`` (the plan's latency-bandwidth fit): a slice sent at d
occupies the network from max(d + alpha, when the network is free) for beta * S; its start-up
alpha overlaps the transfer of slices already in flight, which is what a credit of more than
one slice buys. ByteScheduler's credit: a slice is sent when every higher-priority ready slice
has been and the bytes in flight stay <= credit (one slice always may go); a slice readied
later with a higher priority goes before queued ones (``in_order=True`` instead: the old
runtime's static list order, a bucket waits for every bucket before it in priority order).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BS_CREDIT_ELEMENTS", "BS_PARTITION_ELEMENTS", "SlicedTimeline", "SliceSearch",
           "bytescheduler_default", "cut", "search_slicing", "sliced_iteration"]

# ByteScheduler's defaults (its bytecore: BYTESCHEDULER_PARTITION and BYTESCHEDULER_CREDIT,
# counted in parameters): 1,000,000-element slices, 4,000,000 elements in flight
BS_PARTITION_ELEMENTS = 1_000_000
BS_CREDIT_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class SlicedTimeline:
    """`sliced_iteration`'s result: the iteration's seconds, when each bucket's last slice
    ends (seconds after the backward starts), and the slices (bucket, slice) in sent order."""

    iteration: float
    done: tuple[float, ...]
    sent: tuple[tuple[int, int], ...]


def cut(nbytes: int, slice_bytes: int, element: int = 4) -> list[int]:
    """A bucket of `nbytes` cut into slices of `slice_bytes` (rounded down to whole
    `element`-byte elements, at least one), the last one the rest. O(slices)."""
    step = max(element, slice_bytes // element * element)
    return [min(step, nbytes - a) for a in range(0, nbytes, step)] or [nbytes]


def _schedule(ready: Sequence[float], slices: Sequence[Sequence[int]],
              priority: Sequence[int], credit: int, alpha: float, beta: float,
              in_order: bool) -> tuple[list[float], list[tuple[int, int]]]:
    """(each bucket's end, slices in sent order): the event loop of `sliced_iteration`."""
    rank = {k: i for i, k in enumerate(priority)}
    arrivals = sorted(range(len(ready)), key=lambda k: (ready[k], rank[k]))
    queue: list[tuple[int, int, int]] = []  # (bucket rank, slice, bucket) ready, unsent
    inflight: list[tuple[float, int]] = []  # (end, bytes) heap
    done, left = [0.0] * len(ready), [len(s) for s in slices]
    sent: list[tuple[int, int]] = []
    t, free, held, a, next_rank = 0.0, 0.0, 0, 0, 0
    while len(sent) < sum(len(s) for s in slices):
        while a < len(arrivals) and ready[arrivals[a]] <= t:  # buckets ready by now
            k = arrivals[a]
            queue += [(rank[k], i, k) for i in range(len(slices[k]))]
            a += 1
        heapq.heapify(queue)
        while queue and (not inflight or held + slices[queue[0][2]][queue[0][1]] <= credit):
            r, i, k = queue[0]
            if in_order and r != next_rank:
                break  # the list order: bucket r waits for every bucket before it
            heapq.heappop(queue)
            s = slices[k][i]
            free = max(t + alpha, free) + beta * s
            heapq.heappush(inflight, (free, s))
            held += s
            sent.append((k, i))
            left[k] -= 1
            if not left[k]:
                done[k], next_rank = free, next_rank + 1
        # the next event: a slice ends (its credit returns) or a bucket becomes ready
        nxt = [inflight[0][0]] if inflight else []
        nxt += [ready[arrivals[a]]] if a < len(arrivals) else []
        if not nxt:
            break
        t = max(t, min(nxt))
        while inflight and inflight[0][0] <= t:
            held -= heapq.heappop(inflight)[1]
    return done, sent


def sliced_iteration(ready: Sequence[float], need: Sequence[float],
                     slices: Sequence[Sequence[int]], priority: Sequence[int], credit: int,
                     alpha: float, beta: float, fwd: float, bwd: float, step: float = 0.0,
                     overlap: str = "forward", in_order: bool = False) -> SlicedTimeline:
    """One iteration under partitioned, priority-scheduled AllReduces (module docstring).

    ``overlap="backward"``: fwd + max(bwd, last slice's end) + step (DDP's timeline).
    ``overlap="forward"`` (ByteScheduler's cross-iteration overlap): the renewal cycle from
    the backward's start to the end of the next forward, whose compute reaches ``need[k]``
    only once bucket k is done; the step is spread over the forward (``step`` added once).

    Bound: never below max(fwd + bwd + step, alpha + beta * total bytes); with slices small
    against the compute, alpha -> 0 and the credit one slice, first-layer-first is the order
    ByteScheduler argues optimal (its section 3). Complexity: O(S log S + B log B) for S slices
    and B buckets (one heap of ready slices, one of slices in flight).
    """
    done, sent = _schedule(ready, slices, priority, credit, alpha, beta, in_order)
    if overlap == "backward":
        return SlicedTimeline(fwd + max(bwd, max(done, default=0.0)) + step, tuple(done),
                              tuple(sent))
    t, pos = bwd, 0.0  # the next forward starts when the backward ends
    for k in sorted(range(len(need)), key=lambda k: need[k]):
        t = max(t + need[k] - pos, done[k])  # compute up to where bucket k is read, wait
        pos = need[k]
    return SlicedTimeline(t + fwd - pos + step, tuple(done), tuple(sent))


def bytescheduler_default(sizes: Sequence[int], need: Sequence[float], element: int = 4
                          ) -> dict:
    """ByteScheduler's defaults for buckets of `sizes` bytes (one tensor each, as it
    schedules them): slices of `BS_PARTITION_ELEMENTS` elements, a credit of
    `BS_CREDIT_ELEMENTS` elements, priority first-read-first (the forward's order, ties to the
    later-ready: a higher index). {slice_bytes, slices, priority, credit}. O(B log B)."""
    slice_bytes = BS_PARTITION_ELEMENTS * element
    return {"slice_bytes": slice_bytes, "slices": [cut(s, slice_bytes, element) for s in sizes],
            "priority": sorted(range(len(sizes)), key=lambda k: (need[k], -k)),
            "credit": BS_CREDIT_ELEMENTS * element}


@dataclass(frozen=True)
class SliceSearch:
    """`search_slicing`'s result: the best (slice bytes, credit), its iteration, every grid
    point's iteration in evaluation order, and how many were evaluated."""

    slice_bytes: int
    credit: int
    iteration: float
    grid: tuple[tuple[int, int, float], ...]
    evaluations: int


def search_slicing(ready: Sequence[float], need: Sequence[float], sizes: Sequence[int],
                   alpha: float, beta: float, fwd: float, bwd: float, step: float = 0.0,
                   element: int = 4, slice_mb: Sequence[float] = (0.25, 0.5, 1, 2, 4, 8, 16),
                   credit_slices: Sequence[int] = (1, 2, 4, 8)) -> SliceSearch:
    """The best (slice size, credit) on a counted grid: `slice_mb` MiB slices x credits of
    `credit_slices` slices, plus ByteScheduler's default point, priority first-read-first,
    forward overlap, scored by `sliced_iteration`. Deterministic: ties go to the larger slice,
    then the smaller credit (fewer messages, less held). O(grid x (S log S + B log B))."""
    prio = bytescheduler_default(sizes, need, element)["priority"]
    points = [(int(m * (1 << 20)) // element * element, c) for m in slice_mb
              for c in credit_slices]
    bs = BS_PARTITION_ELEMENTS * element
    points = [(s, s * c) for s, c in points] + [(bs, BS_CREDIT_ELEMENTS * element)]
    grid, best = [], (math.inf, 0, 0)
    for s, c in dict.fromkeys(points):
        t = sliced_iteration(ready, need, [cut(b, s, element) for b in sizes], prio, c, alpha,
                             beta, fwd, bwd, step).iteration
        grid.append((s, c, t))
        best = min(best, (t, -s, c))
    return SliceSearch(-best[1], best[2], best[0], tuple(grid), len(grid))
