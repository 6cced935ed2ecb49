"""Assemble an MSCCL program from per-rank steps and the steps each one waits for.

A step names its rank, the thread block's peers and channel, and the steps (of the same rank)
it must follow. The builder finds or opens the thread block, drops waits that the block's own
order already gives, expresses a second and later cross-block wait as ``nop`` steps (the
executor takes one ``depid`` per step), and marks every awaited step ``hasdep``. Pure data,
linear in the number of steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topocontract.msccl import Gpu, Program, Step, ThreadBlock

__all__ = ["Ref", "ProgramBuilder"]


@dataclass(frozen=True)
class Ref:
    """A step of the program: its rank, thread block id and index in the block."""

    rank: int
    tb: int
    s: int


class ProgramBuilder:
    """Collects steps per rank and thread block; `program` returns the finished Program."""

    def __init__(self, ngpus: int, nchunks: int, coll: str = "allreduce",
                 name: str = "topoctl") -> None:
        self.ngpus, self.nchunks, self.coll, self.name = ngpus, nchunks, coll, name
        self._tbs: list[dict[tuple[int, int, int], ThreadBlock]] = [{} for _ in range(ngpus)]
        self._awaited: set[Ref] = set()

    def block(self, rank: int, send: int, recv: int, chan: int) -> ThreadBlock:
        """The thread block of `rank` sending to `send` and receiving from `recv` on `chan`
        (-1: no such peer), opened on first use."""
        key = (send, recv, chan)
        tbs = self._tbs[rank]
        if key not in tbs:
            tbs[key] = ThreadBlock(id=len(tbs), send=send, recv=recv, chan=chan)
        return tbs[key]

    def step(self, rank: int, tb: ThreadBlock, type_: str, src: int = -1, dst: int = -1,
             cnt: int = 1, after: Sequence[Ref | None] = (), buf: str = "i") -> Ref:
        """Append a step to `tb` of `rank` reading chunk `src` and/or writing chunk `dst` of
        buffer `buf`, waiting for every step in `after` (None entries are ignored)."""
        waits = sorted({r for r in after if r is not None and r.tb != tb.id},
                       key=lambda r: (r.tb, r.s))
        for r in waits[1:]:
            tb.steps.append(Step("nop", buf, -1, buf, -1, 0, r.tb, r.s))
        first = waits[0] if waits else None
        tb.steps.append(Step(type_, buf, src, buf, dst, cnt,
                             first.tb if first else -1, first.s if first else -1))
        self._awaited.update(waits)
        return Ref(rank, tb.id, len(tb.steps) - 1)

    def program(self) -> Program:
        """The finished program: awaited steps marked ``hasdep``."""
        gpus = []
        for rank, tbs in enumerate(self._tbs):
            blocks = sorted(tbs.values(), key=lambda t: t.id)
            for t in blocks:
                t.steps = [Step(**{**st.__dict__, "hasdep": int(Ref(rank, t.id, s) in
                                                                self._awaited)})
                           for s, st in enumerate(t.steps)]
            gpus.append(Gpu(id=rank, i_chunks=self.nchunks, o_chunks=self.nchunks, tbs=blocks))
        return Program(name=self.name, coll=self.coll, nchunksperloop=self.nchunks, gpus=gpus)
