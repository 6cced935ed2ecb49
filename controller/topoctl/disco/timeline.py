"""The two-stream timeline of one data-parallel iteration under a bucket partition, and the
partitions of the anchors (DDP's cap, MG-WFBP, the exact optimum of the linear model).

Plain data: ``units`` are the gradient units in gradient-ready order (one per op that owns
parameters): ``ready[i]`` seconds after the backward pass starts when unit i's gradients are
all ready, ``size[i]`` its gradient bytes. A partition is the tuple of the last unit index of
each bucket, ascending, ending with ``len(units) - 1`` (``(n-1,)``: one bucket). An AllReduce
of S bytes takes ``alpha + beta * S`` seconds (a latency-bandwidth model fitted to the plan's
collective on its network). One communication stream: bucket k starts when its last unit is
ready and bucket k-1 is done (DisCo's and DDP's timeline).

The simulator (`topoctl.sim`) scores the final candidates; this model is what MG-WFBP and the
optimum are defined on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["cap_partition", "comm_end", "mgwfbp_partition", "optimal_partition",
           "ready_times"]


def ready_times(bwd: Sequence[float], owns: Sequence[bool]) -> tuple[list[float], float]:
    """(ready time of each unit, whole backward) from per-op backward seconds in backward
    order (`bwd`) and whether each op owns parameters (`owns`): a unit is ready when its op's
    backward is done. O(ops)."""
    t, out = 0.0, []
    for b, has in zip(bwd, owns, strict=True):
        t += b
        if has:
            out.append(t)
    return out, t


def comm_end(ready: Sequence[float], size: Sequence[int], cuts: Sequence[int],
             alpha: float, beta: float) -> float:
    """When the last bucket's AllReduce ends (seconds from the backward's start) under the
    partition `cuts`. O(units)."""
    end, first = 0.0, 0
    for last in cuts:
        nbytes = sum(size[first:last + 1])
        end = max(end, ready[last]) + alpha + beta * nbytes
        first = last + 1
    return end


def cap_partition(size: Sequence[int], cap: int, first_cap: int | None = None
                  ) -> tuple[int, ...]:
    """DDP's rule (Li et al., VLDB'20): a bucket closes once it holds >= `cap` bytes; the
    first bucket at `first_cap` when given (DDP: 1 MB). O(units)."""
    cuts, acc = [], 0
    for i, s in enumerate(size):
        acc += s
        if acc >= (first_cap if first_cap is not None and not cuts else cap):
            cuts.append(i)
            acc = 0
    if not cuts or cuts[-1] != len(size) - 1:
        cuts.append(len(size) - 1)
    return tuple(cuts)


def mgwfbp_partition(ready: Sequence[float], size: Sequence[int], alpha: float, beta: float
                     ) -> tuple[int, ...]:
    """MG-WFBP's merge of layer gradients (Shi, Wang, Chu, Li, "MG-WFBP: Efficient Data
    Communication for Distributed Synchronous SGD Algorithms", INFOCOM 2019): walking the
    layers in gradient-ready order, merge the next layer into the current bucket when the
    current bucket's AllReduce could not start more than `alpha` before that layer is ready
    (waiting for it costs less than the start-up a separate message pays). Optimal for their
    model when every layer's backward is at least as long as alpha; O(units^2) (start times
    recomputed after each decision)."""
    n = len(size)
    cuts: list[int] = []
    for i in range(n - 1):
        start = _start_of_open_bucket(ready, size, cuts, i, alpha, beta)
        if ready[i + 1] - start >= alpha:  # cannot gain by waiting: close the bucket at i
            cuts.append(i)
    cuts.append(n - 1)
    return tuple(cuts)


def _start_of_open_bucket(ready, size, cuts, i, alpha, beta) -> float:
    """When the bucket ending at unit i (after the closed `cuts`) could start."""
    prev_end = comm_end(ready, size, cuts, alpha, beta) if cuts else 0.0
    return max(prev_end, ready[i])


def optimal_partition(ready: Sequence[float], size: Sequence[int], alpha: float, beta: float
                      ) -> tuple[int, ...]:
    """The partition that minimises `comm_end` exactly under the model (dynamic programming:
    the end of a prefix's last AllReduce is monotone in the end of the prefix before it, so
    the best prefix ending at unit j extends the best prefix ending at some i < j). O(units^2)
    time, O(units) memory; ties go to fewer buckets."""
    n = len(size)
    prefix = [0]
    for s in size:
        prefix.append(prefix[-1] + s)
    best = [math.inf] * n
    back = [-1] * n
    for j in range(n):
        for i in range(-1, j):
            before = best[i] if i >= 0 else 0.0
            t = max(before, ready[j]) + alpha + beta * (prefix[j + 1] - prefix[i + 1])
            if t < best[j] - 1e-15:
                best[j], back[j] = t, i
    cuts, j = [], n - 1
    while j >= 0:
        cuts.append(j)
        j = back[j]
    return tuple(reversed(cuts))
