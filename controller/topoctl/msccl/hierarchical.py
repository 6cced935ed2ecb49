"""The hierarchical AllReduce of hosts with several devices as an MSCCL program (NCCL's and
Blink's layout): reduce-scatter among a host's k ranks over the fast intra-host link, then
shard s all-reduced across the hosts by the ranks holding it (a ring in the planned host order,
one per local rank, so with rails each rail carries its own shard), then all-gather inside the
host. Each host's NICs carry 2(H-1)/H of the buffer in all, as a flat ring's do, and the
intra-host link 2(k-1)/k; every inter-host message is S/(kH). The buffer is cut into k*H
chunks: shard s is chunks s*H..s*H+H-1. Per rank two thread blocks (the host ring on channel 0,
its shard's host ring on channel 1) of 2k-1 and 2H-1 steps; O(k*H*(k+H)) steps in all."""

from __future__ import annotations

from collections.abc import Sequence

from topocontract.msccl import Program
from topoctl.msccl.build import ProgramBuilder
from topoctl.msccl.ring import (
    RingPosition,
    all_gather_steps,
    allreduce_steps,
    reduce_scatter_steps,
)

__all__ = ["hierarchical_allreduce"]

LOCAL, INTER = 0, 1  # channels


def hierarchical_allreduce(hosts: Sequence[Sequence[int]], name: str = "hierarchical"
                           ) -> Program:
    """`hosts`: each host's ranks (local rank order), in the order of the inter-host ring; every
    host the same number k of ranks."""
    k, n_hosts = len(hosts[0]), len(hosts)
    ranks = sorted(r for h in hosts for r in h)
    if any(len(h) != k for h in hosts) or ranks != list(range(len(ranks))):
        raise ValueError("every host needs the same number of ranks, ranks 0..n-1 once each")
    b = ProgramBuilder(len(ranks), k * n_hosts, name=name)
    for hi in range(n_hosts):
        for li in range(k):
            _rank_steps(b, hosts, hi, li, k, n_hosts)
    return b.program()


def _rank_steps(b: ProgramBuilder, hosts: Sequence[Sequence[int]], hi: int, li: int, k: int,
                n_hosts: int) -> None:
    """Host `hi`'s local rank `li`: reduce-scatter over the host's shards (it ends with shard
    li+1), the shard's ring over hosts, the all-gather."""
    rank, local = hosts[hi][li], hosts[hi]
    shard = (li + 1) % k
    reduced = None
    if k > 1:
        at = RingPosition(rank, local[(li + 1) % k], local[(li - 1) % k], li, k, LOCAL,
                          width=n_hosts)
        reduced = reduce_scatter_steps(b, at)
    if n_hosts > 1:
        across = RingPosition(rank, hosts[(hi + 1) % n_hosts][li], hosts[hi - 1][li], hi,
                              n_hosts, INTER, base=shard * n_hosts)
        reduced = allreduce_steps(b, across, after=reduced)
    if k > 1:
        all_gather_steps(b, RingPosition(rank, local[(li + 1) % k], local[(li - 1) % k], li, k,
                                         LOCAL, width=n_hosts), after=reduced)
