"""The previous tree-schedule executor (threaded, one blocking op per 16 KiB chunk), kept only as
the baseline of ``python -m bench.trees.cpu``; training uses ``topotrain.collectives.program``.

AllReduce (sum) that executes a tree schedule with torch.distributed point-to-point ops.

Per tree ``T`` with partition ``P_T`` (size proportional to its rate): every rank adds its
children's chunks into its own and sends the sum to its parent (reduce, child->parent); the
root then sends each finished chunk down, every rank forwarding it to its children
(broadcast, parent->child). Chunks are pipelined (the broadcast of chunk k overlaps the reduce
of chunk k+1) and all trees run at once: two threads per tree (reduce, broadcast) blocking in
``Work.wait`` (which releases the GIL). Works over gloo (CPU) and NCCL.

Tags: tree ``t`` uses ``TAG_BASE + 2t`` (reduce) and ``TAG_BASE + 2t + 1`` (broadcast); chunks
of one (tree, phase, edge) are matched in posting order.
"""

from __future__ import annotations

import math
import queue
import threading

import torch
import torch.distributed as dist

from topocontract.schedule import TreeSchedule, check_world_size, partition_sizes

__all__ = ["TAG_BASE", "legacy_tree_allreduce"]

TAG_BASE = 0x7470  # "tp"
WINDOW = 8  # receives posted ahead per peer


def legacy_tree_allreduce(
    tensor: torch.Tensor,
    schedule: TreeSchedule,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Sum ``tensor`` over all ranks of ``group`` in place, following ``schedule``.

    Raises :class:`~topocontract.schedule.ScheduleMismatch` if the schedule was made
    for another world size.
    """
    world = dist.get_world_size(group)
    check_world_size(schedule, world)
    rank = dist.get_rank(group)
    if world == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    sizes = partition_sizes(flat.numel(), schedule.fractions)
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    offset = 0
    for t_idx, (tree, size) in enumerate(zip(schedule.trees, sizes, strict=True)):
        if size == 0:
            continue
        part = flat[offset : offset + size]
        offset += size
        chunk = max(1, (tree.chunk_bytes or schedule.chunk_bytes) // flat.element_size())
        runner = _TreeRun(part, tree.parents, rank, chunk, TAG_BASE + 2 * t_idx, group)
        for fn in (runner.reduce, runner.broadcast):
            th = threading.Thread(target=_guard(fn, errors), daemon=True)
            th.start()
            threads.append(th)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def _guard(fn, errors: list[BaseException]):
    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    return run


class _TreeRun:
    """One tree's reduce and broadcast on one rank."""

    def __init__(self, part, parents, rank, chunk, tag, group):
        self.part = part
        self.parent = parents[rank]
        self.children = [c for c, p in enumerate(parents) if p == rank]
        self.chunk = chunk
        self.n = math.ceil(part.numel() / chunk)
        self.rtag, self.btag = tag, tag + 1
        self.pg = group if group is not None else dist.distributed_c10d._get_default_group()
        self.handoff: queue.Queue = queue.Queue()

    def _sl(self, k: int) -> slice:
        return slice(k * self.chunk, min(self.part.numel(), (k + 1) * self.chunk))

    # the process group's own send/recv (group ranks): dist.isend's per-call checks and
    # logging wrapper cost more CPU than a 16 KiB chunk's transfer on 2 cores
    def _send(self, buf, peer, tag):
        return self.pg.send([buf], peer, tag)

    def _recv(self, buf, peer, tag):
        return self.pg.recv([buf], peer, tag)

    def reduce(self) -> None:
        bufs = {c: torch.empty_like(self.part) for c in self.children}
        pending: dict[tuple[int, int], object] = {}

        def post(k: int) -> None:
            for c in self.children:
                pending[(c, k)] = self._recv(bufs[c][self._sl(k)], c, self.rtag)

        for k in range(min(WINDOW, self.n)):
            post(k)
        for k in range(self.n):
            sl = self._sl(k)
            for c in self.children:
                pending.pop((c, k)).wait()
                self.part[sl].add_(bufs[c][sl])
            if k + WINDOW < self.n:
                post(k + WINDOW)
            work = None
            if self.parent is not None:
                work = self._send(self.part[sl], self.parent, self.rtag)
            self.handoff.put(work)

    def broadcast(self) -> None:
        sends = []
        if self.parent is None:  # root: send each chunk down once it is reduced
            for k in range(self.n):
                self.handoff.get()
                for c in self.children:
                    sends.append(self._send(self.part[self._sl(k)], c, self.btag))
            for w in sends:
                w.wait()
            return
        stage = torch.empty_like(self.part)
        recvs = {}
        for k in range(min(WINDOW, self.n)):
            recvs[k] = self._recv(stage[self._sl(k)], self.parent, self.btag)
        for k in range(self.n):
            recvs.pop(k).wait()
            if k + WINDOW < self.n:
                recvs[k + WINDOW] = self._recv(
                    stage[self._sl(k + WINDOW)], self.parent, self.btag
                )
            for c in self.children:
                sends.append(self._send(stage[self._sl(k)], c, self.btag))
        for _ in range(self.n):  # our reduce sends read `part`: finish them before overwriting
            w = self.handoff.get()
            if w is not None:
                w.wait()
        for w in sends:
            w.wait()
        self.part.copy_(stage)
