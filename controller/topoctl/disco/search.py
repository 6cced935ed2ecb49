"""DisCo's search: best-first with backtracking over joint (operator fusion, tensor fusion)
decisions (Wang et al., "DisCo: Distributed Training with Joint Operator and Tensor Fusion",
TPDS; code: TPDS-Submission/Disco).

A candidate is a fusion option (a name of the caller's `fusion_options`), a bucket
partition (`topoctl.disco.timeline`: the last unit index of each bucket) and what the
AllReduces overlap with (`topocontract.buckets`: ``backward``, DDP's timeline, or
``forward``, the next iteration's forward; with ``tail``, the number of last-ready buckets,
the first layers', held back and all-reduced in forward order: `issue_order`). The search keeps a
bounded priority queue (`queue`, 50 as DisCo) of candidates ordered by their cost, always
expands the best one by `moves` random legal changes (merge two neighbouring buckets, split
a bucket, move a boundary, switch the fusion option, switch the overlap, grow or shrink the
held-back tail), and keeps a new candidate only within
`keep` (1.1, as DisCo) of the best found; a candidate whose expansions do not improve leaves
the queue, so the next pop resumes an older, worse branch: backtracking. An expansion's
moves lead to candidates not evaluated yet (`neighbours` draws again, up to `ATTEMPTS` times
a move, rather than spend a move on one already scored). When the queue runs dry with budget
left (every branch out of the window: on ResNet-18 it emptied after 32 of 300 simulations,
one expansion whose three of four moves led back to initial candidates), it is refilled with
the candidates kept within `keep` of the best, best first, except those whose last expansion
found nothing new, and the search goes on with new random moves; it stops after `budget`
cost evaluations or when no kept candidate has anything new around it.

Deterministic for a seed (one `random.Random(seed)`, ties broken by insertion order) as long
as `cost` is. The caller's `cost` is the expensive part (a simulation); the search itself is
O(budget * (log queue + units)). `progress(evaluations, best_cost)` is called every
`every` evaluations (the caller prints it).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field, replace

__all__ = ["Candidate", "SearchResult", "best_first", "issue_order", "neighbours"]

ATTEMPTS = 8  # random draws per move `neighbours` may spend looking for a new candidate


@dataclass(frozen=True, order=True)
class Candidate:
    """A joint decision: the fusion option's name, the bucket partition (cut indices), the
    overlap (``backward`` or ``forward``) and, for ``forward``, the held-back tail (>= 1);
    sliced (`topocontract.slicing`, forward overlap only) when `slice_bytes` > 0: buckets
    cut into slices of that size, all-reduced first-read-first within `credit` bytes."""

    fusion: str
    cuts: tuple[int, ...]
    overlap: str = "backward"
    tail: int = 1
    slice_bytes: int = 0
    credit: int = 0


def issue_order(buckets: int, tail: int) -> list[int]:
    """The AllReduce order of `buckets` buckets (numbered in gradient-ready order) when the
    last `tail` are held back and issued in forward order (the first layers' first) once the
    last is ready: the static priority a plan gives the buckets the next forward needs first
    (ByteScheduler's and PACE's priority, fixed so that every rank issues the same order).
    ``tail == 1``: ready order. O(buckets)."""
    t = max(1, min(tail, buckets))
    return list(range(buckets - t)) + list(range(buckets - 1, buckets - t - 1, -1))


@dataclass
class SearchResult:
    """The best candidate, its cost, the candidates kept within `keep` of it (best first),
    evaluations spent, expansions done, the best cost after each expansion and how often
    the queue ran dry and was refilled (`best_first`)."""

    best: Candidate
    cost: float
    kept: list[tuple[float, Candidate]]
    evaluations: int
    expansions: int
    trace: list[float] = field(default_factory=list)
    restarts: int = 0


def neighbours(c: Candidate, n: int, fusions: Sequence[str], rng: random.Random,
               moves: int, overlaps: Sequence[str] = ("backward",),
               exclude: Container[Candidate] = ()) -> list[Candidate]:
    """Up to `moves` random legal changes of `c` over `n` units, none in `exclude` (the
    candidates already evaluated: a move that leads back to one is drawn again, at most
    `ATTEMPTS` draws per move), duplicates dropped."""
    out: list[Candidate] = []
    kinds = [0, 1, 2] + ([3] if len(fusions) > 1 else []) + ([4, 5] if len(overlaps) > 1
                                                              else [])
    for _ in range(moves * ATTEMPTS):
        if len(out) >= moves:
            break
        kind = kinds[rng.randrange(len(kinds))]
        if kind >= 4:
            new = _overlap_move(c, kind, overlaps, rng)
        elif kind == 3:
            others = [f for f in fusions if f != c.fusion]
            new = replace(c, fusion=others[rng.randrange(len(others))])
        else:
            cuts = _cuts_move(list(c.cuts), kind, n, rng)
            new = replace(c, cuts=tuple(cuts), tail=min(c.tail, len(cuts)))
        if new != c and new not in out and new not in exclude:
            out.append(new)
    return out


def _cuts_move(cuts: list[int], kind: int, n: int, rng: random.Random) -> list[int]:
    """`cuts` after move `kind` (0: merge two neighbouring buckets, 1: split one, 2: move a
    boundary by 1..3 units), unchanged where the move does not apply."""
    if kind == 0 and len(cuts) > 1:  # merge bucket k with bucket k+1
        del cuts[rng.randrange(len(cuts) - 1)]
    elif kind == 1 and len(cuts) < n:  # split: a new boundary where there is none
        free = sorted(set(range(n - 1)) - set(cuts))
        cuts = sorted(cuts + [free[rng.randrange(len(free))]])
    elif kind == 2 and len(cuts) > 1:  # move a boundary by 1..3 units
        k = rng.randrange(len(cuts) - 1)
        lo = cuts[k - 1] + 1 if k else 0
        cuts[k] = min(max(cuts[k] + rng.choice((-3, -2, -1, 1, 2, 3)), lo), cuts[k + 1] - 1)
    return cuts


def _overlap_move(c: Candidate, kind: int, overlaps: Sequence[str], rng: random.Random
                  ) -> Candidate:
    """Kind 4: another overlap (tail 1 again); kind 5 (forward only): the tail 1..3 longer
    or shorter, within 1..buckets. A sliced candidate stays as it is (its priority is not a
    tail, and slicing is planned with forward overlap only)."""
    if c.slice_bytes:
        return c
    if kind == 4 or c.overlap == "backward":
        others = [o for o in overlaps if o != c.overlap]
        return replace(c, overlap=others[rng.randrange(len(others))], tail=1)
    step = rng.choice((-3, -2, -1, 1, 2, 3))
    return replace(c, tail=max(1, min(len(c.cuts), c.tail + step)))


def best_first(initial: Sequence[Candidate], n: int, fusions: Sequence[str],
               cost: Callable[[Candidate], float], seed: int = 0, queue: int = 50,
               keep: float = 1.1, budget: int = 300, moves: int = 4,
               progress: Callable[[int, float], None] | None = None, every: int = 50,
               overlaps: Sequence[str] = ("backward",)) -> SearchResult:
    """Best-first search with backtracking from the `initial` candidates (module docstring).
    Every initial candidate is evaluated (it counts against the budget too)."""
    rng = random.Random(seed)
    seen: dict[Candidate, float] = {}
    heap: list[tuple[float, int, Candidate]] = []
    tick = 0

    def score(c: Candidate) -> float:
        nonlocal tick
        seen[c] = cost(c)
        if progress is not None and len(seen) % every == 0:
            progress(len(seen), min(seen.values()))
        return seen[c]

    for c in initial:
        if c not in seen:
            heapq.heappush(heap, (score(c), tick, c))
            tick += 1
    expansions, restarts, trace = 0, 0, []
    exhausted: set[Candidate] = set()  # an expansion found nothing new around these
    while len(seen) < budget:
        best = min(seen.values())
        if not heap:  # run dry with budget left: expand the kept candidates again
            again = sorted((t, c) for c, t in seen.items()
                           if t <= keep * best and c not in exhausted)[:queue]
            if not again:
                break
            heap = [(t, tick + i, c) for i, (t, c) in enumerate(again)]
            tick += len(again)
            restarts += 1
        t, _, c = heapq.heappop(heap)
        if t > keep * best:
            continue  # fell out of the 1.1x window since it was queued
        expansions += 1
        new = neighbours(c, n, fusions, rng, moves, overlaps, seen)
        if not new:
            exhausted.add(c)
        for m in new:
            if len(seen) >= budget:
                break
            tm = score(m)
            if tm <= keep * min(seen.values()):
                heapq.heappush(heap, (tm, tick, m))
                tick += 1
        if len(heap) > queue:  # bounded: keep the `queue` best
            heap = heapq.nsmallest(queue, heap)
            heapq.heapify(heap)
        trace.append(min(seen.values()))
    best = min(seen.values())
    # equal costs go to the smaller cut tuple (fusion name, then the earliest boundaries:
    # more, smaller buckets early). Fewer buckets on ties was tried and not kept: on the lab
    # (docs/results.md, DisCo) the partitions with more buckets measured faster than MG-WFBP's
    # of equal simulated time on two of three models (under load)
    ranked = sorted((t, c) for c, t in seen.items() if t <= keep * best)
    return SearchResult(ranked[0][1], ranked[0][0], ranked, len(seen), expansions, trace,
                        restarts)
