"""Packed spanning trees' AllReduce as an MSCCL program.

Zhang, Wu and Li, "Near-optimal topology-adaptive parameter synchronization" (INFOCOM 2021):
each tree reduces its share of the buffer toward its root and broadcasts it back; the shares
follow the trees' LP rates, so the program reaches the packing's rate up to the rounding of the
shares to whole chunks (at most half a chunk per tree, 1/(2*nchunks) of the buffer). ForestColl
emits the same shape. Each tree runs on a channel of its own (one connection per peer pair and
channel); a node reduces its children one after another into its chunk range, sends it up,
receives the result and sends it down. O(sum of tree sizes x pieces) steps, a piece being at
most MSCCL_MAX_COUNT-1 chunks."""

from __future__ import annotations

from collections.abc import Sequence

from topocontract.msccl import Limits, Program
from topocontract.schedule import partition_sizes
from topoctl.msccl.build import ProgramBuilder, Ref

__all__ = ["tree_chunks", "trees_allreduce"]

EXECUTOR_LIMITS = Limits()


def tree_chunks(rates: Sequence[float], nchunks: int) -> list[int]:
    """Whole chunks per tree in proportion to `rates` (largest remainder, as the runtime
    splits tensors)."""
    total = sum(rates)
    return partition_sizes(nchunks, [r / total for r in rates])


def trees_allreduce(trees: Sequence[tuple[Sequence[int | None], float]], nchunks: int,
                    name: str = "trees", limits: Limits = EXECUTOR_LIMITS) -> Program:
    """The AllReduce over `trees` (each: every rank's parent, None at the root; and its rate),
    the buffer cut into `nchunks` chunks shared out by rate; a tree whose share rounds to no
    chunk is left out."""
    ngpus = len(trees[0][0])
    b = ProgramBuilder(ngpus, nchunks, name=name)
    start, chan = 0, 0
    for (parents, _), count in zip(trees, tree_chunks([r for _, r in trees], nchunks),
                                   strict=True):
        for off in range(start, start + count, limits.max_count - 1):
            piece = min(limits.max_count - 1, start + count - off)
            for rank in range(ngpus):
                _node_steps(b, parents, rank, chan, off, piece)
        start += count
        chan += count > 0
    return b.program()


def _node_steps(b: ProgramBuilder, parents: Sequence[int | None], rank: int, chan: int,
                off: int, cnt: int) -> None:
    """`rank`'s part of one tree for chunks off..off+cnt-1: reduce children, up, down."""
    children = [c for c, p in enumerate(parents) if p == rank]
    last: Ref | None = None
    for c in children:
        last = b.step(rank, b.block(rank, c, c, chan), "rrc", src=off, dst=off, cnt=cnt,
                      after=[last])
    parent = parents[rank]
    ready = last
    if parent is not None:
        up = b.block(rank, parent, parent, chan)
        b.step(rank, up, "s", src=off, cnt=cnt, after=[last])
        ready = b.step(rank, up, "r", dst=off, cnt=cnt)
    for c in children:
        b.step(rank, b.block(rank, c, c, chan), "s", src=off, cnt=cnt, after=[ready])
