"""Ring AllReduce as an MSCCL program, in the planner's ring order.

Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations"
(JPDC 2009): n-1 reduce-scatter steps then n-1 all-gather steps around the ring, each rank
sending 2(n-1)/n of the buffer to its successor, the bandwidth bound of any AllReduce on a
ring. With ``channels`` c the buffer is cut into c*n chunks and c rings run side by side (as
NCCL's channels do). One thread block per rank and channel of 2n-1 steps (fused receive-reduce-
send instructions); O(c*n^2) steps in all."""

from __future__ import annotations

from collections.abc import Sequence

from topocontract.msccl import Program
from topoctl.msccl.build import ProgramBuilder

__all__ = ["ring_allreduce"]


def ring_allreduce(order: Sequence[int], channels: int = 1, name: str = "ring") -> Program:
    """The AllReduce ring through ranks `order` (every rank once), on `channels` channels."""
    n = len(order)
    if sorted(order) != list(range(n)) or n < 2:
        raise ValueError(f"ring order {list(order)} is not a permutation of 2 or more ranks")
    b = ProgramBuilder(n, channels * n, name=name)
    for chan in range(channels):
        for p, rank in enumerate(order):
            _ring_steps(b, rank, order[(p + 1) % n], order[(p - 1) % n], p, n, chan)
    return b.program()


def _ring_steps(b: ProgramBuilder, rank: int, nxt: int, prev: int, p: int, n: int,
                chan: int) -> None:
    """Position `p`'s steps: at reduce-scatter step j it sends chunk p-j and reduces chunk
    p-j-1; it ends holding chunk p+1 reduced, which the all-gather passes on."""
    tb = b.block(rank, nxt, prev, chan)

    def chunk(k: int) -> int:
        return chan * n + k % n

    b.step(rank, tb, "s", src=chunk(p))
    for j in range(1, n - 1):
        b.step(rank, tb, "rrs", src=chunk(p - j))
    b.step(rank, tb, "rrcs", src=chunk(p + 1), dst=chunk(p + 1))
    for j in range(1, n - 1):
        b.step(rank, tb, "rcs", dst=chunk(p + 1 - j))
    b.step(rank, tb, "r", dst=chunk(p + 2))
