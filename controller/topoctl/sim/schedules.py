"""The collective interface: a collective is a `Schedule`, a DAG of point-to-point steps.

A `Step` sends `size` bytes from `src` to `dst` once every step listed in `deps` (indices into
the same schedule, all smaller than its own index) has been delivered. The engine routes each
step over the network's paths, shares links max-min fairly with everything else in flight, and
the collective completes when all its steps are delivered. Nothing else is assumed: any
algorithm (ring, packed trees with partition sizes, hierarchical, parameter server) is a
function `(members, size, ...) -> Schedule`.

Ring AllReduce (Patarasuk & Yuan, JPDC'09) over any member order: reduce-scatter then all-gather,
2(n-1) rounds, in each round every member sends one chunk of S/n to its predecessor in the order
(order[i] to order[i-1]: the direction of gloo's ring, which DDP runs; measured in the lab, each
host's bytes leave towards the host before it), after it has received the previous round's
chunk from its successor. On links of bandwidth B it takes
2(n-1)/n * S/B (the bandwidth-optimal lower bound for AllReduce), plus 2(n-1) path latencies.
Building it is 2n(n-1) steps, O(n^2) time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Protocol


class Step(NamedTuple):
    """One point-to-point transfer (a NamedTuple: schedules have O(n^2) of them)."""

    src: str
    dst: str
    size: float  # bytes
    deps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Schedule:
    """`scale` multiplies every step's size: an algorithm may build one unit schedule per
    member order (cached) and reuse it for every bucket size."""

    name: str
    members: tuple[str, ...]
    steps: tuple[Step, ...]
    scale: float = 1.0

    def check(self) -> None:
        """Raise ValueError unless deps point backwards and endpoints are members."""
        members = set(self.members)
        for i, s in enumerate(self.steps):
            if s.src not in members or s.dst not in members:
                raise ValueError(f"{self.name}: step {i} {s.src}->{s.dst} leaves the members")
            if s.size * self.scale < 0:
                raise ValueError(f"{self.name}: step {i} has negative size")
            for d in s.deps:
                if not 0 <= d < i:
                    raise ValueError(f"{self.name}: step {i} depends on step {d} (not earlier)")

    def bytes_sent(self) -> dict[str, float]:
        """Bytes each member sends in the schedule."""
        out = dict.fromkeys(self.members, 0.0)
        for s in self.steps:
            out[s.src] += s.size * self.scale
        return out


class CollectiveAlgorithm(Protocol):
    """What a collective implementation provides: members (in the algorithm's order) and the
    bytes of the buffer being all-reduced -> a Schedule."""

    def __call__(self, members: Sequence[str], size: float) -> Schedule: ...


def _ring(name: str, order: Sequence[str], size: float, rounds: int) -> Schedule:
    return Schedule(name, tuple(order), ring_steps(tuple(order), rounds), float(size))


@lru_cache(maxsize=32)
def ring_steps(order: tuple[str, ...], rounds: int) -> tuple[Step, ...]:
    """Unit-size ring steps (chunks of 1/n) of `rounds` rounds of gloo's ring over `order`
    (``2(n - 1)`` rounds: an AllReduce), shared by every bucket over the same order (cached).
    O(rounds * n)."""
    n = len(order)
    if n < 2:
        return ()
    chunk = 1.0 / n
    # gloo's ring (what DDP runs): each rank sends to the rank before it, and receives from
    # the one after it what that one received the round before
    pairs = [(order[i], order[(i - 1) % n]) for i in range(n)]
    steps = [Step(a, b, chunk) for a, b in pairs]
    for k in range(1, rounds):
        base = (k - 1) * n
        steps += [Step(a, b, chunk, (base + (i + 1) % n,)) for i, (a, b) in enumerate(pairs)]
    return tuple(steps)


def ring_allreduce(order: Sequence[str], size: float) -> Schedule:
    """Ring AllReduce over `order` (order[i] sends to order[i-1], cyclically: gloo's way)."""
    return _ring("ring-allreduce", order, size, 2 * (len(order) - 1))


def ring_allgather(order: Sequence[str], size: float) -> Schedule:
    """All-gather of a `size`-byte result (each member contributes size/n)."""
    return _ring("ring-allgather", order, size, len(order) - 1)


def from_phases(name: str, members: Sequence[str],
                phases: Sequence[Sequence[tuple[str, str, float]]]) -> Schedule:
    """A phase-synchronous schedule: every step of phase k waits for all steps of phase k-1
    (a barrier between phases). Handy for hand-written schedules and tests."""
    steps: list[Step] = []
    prev: tuple[int, ...] = ()
    for phase in phases:
        cur = []
        for src, dst, size in phase:
            cur.append(len(steps))
            steps.append(Step(src, dst, size, prev))
        prev = tuple(cur)
    return Schedule(name, tuple(members), tuple(steps))


ALGORITHMS: dict[str, CollectiveAlgorithm] = {"ring": ring_allreduce}


def register(name: str, algorithm: CollectiveAlgorithm) -> None:
    """Make an AllReduce algorithm selectable by name (strategies look it up here)."""
    ALGORITHMS[name] = algorithm
