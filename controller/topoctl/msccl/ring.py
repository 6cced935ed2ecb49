"""Ring collectives as MSCCL programs, in the planner's ring order.

Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations"
(JPDC 2009): n-1 reduce-scatter steps then n-1 all-gather steps around the ring, each rank
sending 2(n-1)/n of the buffer to its successor, the bandwidth bound of any AllReduce on a
ring. With ``channels`` c the buffer is cut into c*n chunks and c rings run side by side (as
NCCL's channels do). One thread block per rank and channel of 2n-1 steps (fused receive-reduce-
send instructions); O(c*n^2) steps in all. The reduce-scatter and all-gather halves are also
steps of their own (`reduce_scatter_steps`, `all_gather_steps`) for programs that compose them
(`topoctl.msccl.hierarchical`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topocontract.msccl import Program
from topoctl.msccl.build import ProgramBuilder, Ref

__all__ = ["RingPosition", "all_gather_steps", "allreduce_steps", "reduce_scatter_steps",
           "ring_allreduce"]


@dataclass(frozen=True)
class RingPosition:
    """One rank's place on a ring: its neighbours, its position `p` of `n`, the channel, and
    the first chunk and the width (chunks) of each of the ring's n pieces."""

    rank: int
    nxt: int
    prev: int
    p: int
    n: int
    chan: int
    base: int = 0
    width: int = 1

    def chunk(self, k: int) -> int:
        """The first chunk of piece `k` (mod n)."""
        return self.base + (k % self.n) * self.width


def ring_allreduce(order: Sequence[int], channels: int = 1, name: str = "ring") -> Program:
    """The AllReduce ring through ranks `order` (every rank once), on `channels` channels."""
    n = len(order)
    if sorted(order) != list(range(n)) or n < 2:
        raise ValueError(f"ring order {list(order)} is not a permutation of 2 or more ranks")
    b = ProgramBuilder(n, channels * n, name=name)
    for chan in range(channels):
        for p, rank in enumerate(order):
            allreduce_steps(b, RingPosition(rank, order[(p + 1) % n], order[(p - 1) % n], p, n,
                                            chan, base=chan * n))
    return b.program()


def allreduce_steps(b: ProgramBuilder, at: RingPosition, after: Ref | None = None) -> Ref:
    """Position `at.p`'s AllReduce: at reduce-scatter step j it sends piece p-j and reduces
    piece p-j-1; it ends holding piece p+1 reduced, which the all-gather passes on. The first
    step waits for `after`; returns the last step."""
    tb = b.block(at.rank, at.nxt, at.prev, at.chan)
    p, w = at.p, at.width
    b.step(at.rank, tb, "s", src=at.chunk(p), cnt=w, after=[after])
    for j in range(1, at.n - 1):
        b.step(at.rank, tb, "rrs", src=at.chunk(p - j), cnt=w)
    b.step(at.rank, tb, "rrcs", src=at.chunk(p + 1), dst=at.chunk(p + 1), cnt=w)
    for j in range(1, at.n - 1):
        b.step(at.rank, tb, "rcs", dst=at.chunk(p + 1 - j), cnt=w)
    return b.step(at.rank, tb, "r", dst=at.chunk(p + 2), cnt=w)


def reduce_scatter_steps(b: ProgramBuilder, at: RingPosition, after: Ref | None = None) -> Ref:
    """The reduce-scatter half: position p ends holding piece p+1 summed over the ring."""
    tb = b.block(at.rank, at.nxt, at.prev, at.chan)
    p, w = at.p, at.width
    b.step(at.rank, tb, "s", src=at.chunk(p), cnt=w, after=[after])
    for j in range(1, at.n - 1):
        b.step(at.rank, tb, "rrs", src=at.chunk(p - j), cnt=w)
    return b.step(at.rank, tb, "rrc", src=at.chunk(p + 1), dst=at.chunk(p + 1), cnt=w)


def all_gather_steps(b: ProgramBuilder, at: RingPosition, after: Ref | None = None) -> Ref:
    """The all-gather half: position p starts holding piece p+1 and ends holding all."""
    tb = b.block(at.rank, at.nxt, at.prev, at.chan)
    p, w = at.p, at.width
    b.step(at.rank, tb, "s", src=at.chunk(p + 1), cnt=w, after=[after])
    for j in range(1, at.n - 1):
        b.step(at.rank, tb, "rcs", dst=at.chunk(p + 1 - j), cnt=w)
    return b.step(at.rank, tb, "r", dst=at.chunk(p + 2), cnt=w)

