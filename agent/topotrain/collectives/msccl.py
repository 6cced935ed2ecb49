"""Reference executor of MSCCL programs over torch.distributed send/recv (gloo here).

It runs the XML that `topoctl export nccl` writes for msccl-executor-nccl, with the executor's
semantics (`topocontract.msccl`): the buffer cut into ``nchunksperloop`` equal chunks, every
thread block a thread running its steps in order, a step first waiting for the step of another
block it names, sends and receives matched in order per peer pair and channel (the channel is
the point-to-point tag). So a program that computes the wrong collective, deadlocks or sends
more than the plan says fails here before it reaches a GPU. It checks programs; it is not meant
to be fast (one message per step, no slicing of chunks).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist

from topocontract.msccl import RECV_TYPES, SEND_TYPES, MscclError, Program, Step, ThreadBlock

__all__ = ["run_allreduce"]


class _Progress:
    """Steps done per thread block of this rank, and a condition to wait for more."""

    def __init__(self, nblocks: int) -> None:
        self.done = [0] * nblocks
        self.cond = threading.Condition()
        self.failed: BaseException | None = None

    def wait_for(self, tb: int, step: int) -> None:
        with self.cond:
            while self.done[tb] <= step and self.failed is None:
                self.cond.wait()
            if self.failed is not None:
                raise RuntimeError("another thread block failed") from self.failed

    def finish(self, tb: int) -> None:
        with self.cond:
            self.done[tb] += 1
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            self.failed = self.failed or exc
            self.cond.notify_all()


def _execute(st: Step, chunks: torch.Tensor, received: torch.Tensor | None) -> torch.Tensor | None:
    """Apply one step to the rank's chunked buffer; return what it sends, if anything."""
    src = chunks[st.srcoff:st.srcoff + st.cnt] if st.srcoff >= 0 else None
    dst = chunks[st.dstoff:st.dstoff + st.cnt] if st.dstoff >= 0 else None
    kind = st.type
    if kind == "s":
        return src.clone()
    if kind in {"r", "rcs"}:
        dst.copy_(received)
        return received if kind == "rcs" else None
    if kind == "rrs":
        return src + received
    if kind in {"rrc", "rrcs"}:
        total = src + received
        dst.copy_(total)
        return total if kind == "rrcs" else None
    if kind == "cpy":
        dst.copy_(src.clone())
    elif kind == "re":
        dst.add_(src)
    return None


def _run_block(tb: ThreadBlock, chunks: torch.Tensor, progress: _Progress,
               peers: Sequence[int], group: dist.ProcessGroup | None) -> None:
    """One thread block's steps, in order (one thread)."""
    pending = []
    for st in tb.steps:
        if st.depid >= 0:
            progress.wait_for(st.depid, st.deps)
        received = None
        if st.type in RECV_TYPES:
            received = torch.empty_like(chunks[:st.cnt])
            dist.recv(received, src=peers[tb.recv], group=group, tag=tb.chan)
        out = _execute(st, chunks, received)
        if st.type in SEND_TYPES:
            out = out.contiguous()
            pending.append((dist.isend(out, dst=peers[tb.send], group=group, tag=tb.chan), out))
        progress.finish(tb.id)
    for work, _ in pending:
        work.wait()


def run_allreduce(program: Program, tensor: torch.Tensor,
                  group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum `tensor` over the group's ranks in place by running `program` (its gpu ``i`` is the
    group's rank ``i``); returns `tensor`."""
    world = dist.get_world_size(group)
    if program.coll != "allreduce" or program.ngpus != world:
        raise MscclError(f"program {program.name!r} is a {program.coll} for {program.ngpus} "
                         f"ranks, not an allreduce for {world}")
    gpu = program.gpus[dist.get_rank(group)]
    n = program.nchunksperloop
    flat = tensor.detach().reshape(-1)
    padded = torch.zeros(-(-flat.numel() // n) * n, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    chunks = padded.view(n, -1)
    peers = [dist.get_global_rank(group, r) if group is not None else r for r in range(world)]
    progress = _Progress(len(gpu.tbs))
    threads = [threading.Thread(target=_guarded, args=(tb, chunks, progress, peers, group),
                                name=f"msccl-tb{tb.id}") for tb in gpu.tbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if progress.failed is not None:
        raise RuntimeError(f"MSCCL program {program.name!r} failed") from progress.failed
    with torch.no_grad():
        tensor.view(-1).copy_(padded[:flat.numel()])
    return tensor


def _guarded(tb: ThreadBlock, chunks: torch.Tensor, progress: _Progress, peers: Sequence[int],
             group: dist.ProcessGroup | None) -> None:
    try:
        _run_block(tb, chunks, progress, peers, group)
    except BaseException as exc:  # handed to the caller's thread through `progress`
        progress.fail(exc)
