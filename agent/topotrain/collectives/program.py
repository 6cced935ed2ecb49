"""Lock-step executor of tree schedules: a schedule + a tensor size compiled into a program.

Algorithm (the pipelined tree AllReduce of Zhang, Wu, Li, INFOCOM'21 / Blink, MLSys'20, and of
NCCL's trees, run as a synchronous step program): every tree ``t`` cuts its partition into the
same number ``C`` of chunks (so a chunk takes the same time on every tree at its rate). With
``up(r)`` the height of ``r``'s subtree (leaves 0), ``depth(r)`` its distance to the root and
``h_t = up(root)``:

* reduce: ``r`` sends chunk ``k`` (its own data plus its children's) to its parent at step
  ``k + up(r)``; it received chunk ``k`` from child ``c`` at step ``k + up(c) < k + up(r)``;
* broadcast: the root sends the finished chunk ``k`` down at step ``k + h_t``, a rank at depth
  ``d`` forwards it at step ``k + h_t + d`` (it arrived at step ``k + h_t + d - 1``).

So chunk ``k`` of the reduce overlaps chunk ``k - 1`` (and earlier) of the broadcast, a tree
takes ``C + 2 h_t - 1`` steps and the program ``max_t (C + 2 h_t - 1)``. In one step a rank
sends at most one message to each peer and receives at most one from each: the pieces of all
trees and both phases that go to the same peer in that step are packed (in (tree, phase, chunk)
order, the same on both ends) into one contiguous buffer. All sends and receives of a step are
posted at once; each received message is added (reduce) or copied (broadcast) in place as soon
as it is in (the step's sends read other chunks), then the sends are waited for; a message
with a single piece is sent from / received into the tensor itself when no addition is needed.
One thread, no locks.

Correctness of the in-place buffer: a rank's reduce send of chunk ``k`` (step ``k + up(r)``)
precedes the broadcast receive that overwrites it (step ``k + h_t + d - 1 >= k + up(r) + 2d - 1``,
``d >= 1``), and every step's operations complete before the next step starts. Within a step,
the chunk a reduce piece is added into (``s - up(c)`` for a child ``c``) or a broadcast piece
copied into (``s - h_t - d + 1``) is never the one a send of that step reads (``s - up(r)``,
``s - h_t - d``), so a message is processed while the others are still in flight.

Cost: compiling is ``O(T * C * deg(r))`` for the rank's own tree edges; executing is
``max_t (C + 2 h_t - 1)`` steps of at most ``2 * peers`` point-to-point operations each.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from topocontract.schedule import TreeSchedule, check_world_size, partition_sizes
from topocontract.trees import LOOKAHEAD, chunk_count, up_depth

__all__ = [
    "LOOKAHEAD",
    "TAG",
    "Program",
    "chunk_count",
    "compile_program",
    "run_program",
    "tree_allreduce",
]

TAG = 0x7470  # "tp": one tag, messages between two ranks match in step order
_REDUCE, _BCAST = 0, 1


@dataclass(frozen=True)
class Message:
    """One message to or from ``peer`` in one step: ``pieces`` are ``(offset, length, kind)``
    in the flat tensor (kind: 0 reduce, 1 broadcast), in wire order."""

    peer: int
    pieces: tuple[tuple[int, int, int], ...]
    length: int  # elements: the sum of the pieces' lengths


@dataclass(frozen=True)
class Program:
    """What one rank does for an AllReduce of ``numel`` elements: ``steps[s] = (sends,
    recvs)``; ``scratch`` elements of staging memory suffice for any step."""

    rank: int
    world_size: int
    numel: int
    chunks: int
    steps: tuple[tuple[tuple[Message, ...], tuple[Message, ...]], ...]
    scratch: int

    def ops(self) -> int:
        """Point-to-point operations this rank posts."""
        return sum(len(s) + len(r) for s, r in self.steps)


def compile_program(
    schedule: TreeSchedule, numel: int, rank: int, chunks: int
) -> Program:
    """The lock-step program of ``rank`` for an AllReduce of ``numel`` elements with ``chunks``
    chunks per tree (chunk ``k`` of a partition of ``n`` elements is
    ``[floor(k n / C), floor((k+1) n / C))``; empty chunks send nothing). Deterministic: every
    rank derives the same message boundaries. O(T * C * deg(rank))."""
    world = schedule.world_size
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in 0..{world - 1}")
    chunks = max(1, int(chunks))
    sizes = partition_sizes(numel, schedule.fractions)
    # (step, peer) -> list of (tree, phase, k, offset, length, kind)
    sends: dict[tuple[int, int], list] = {}
    recvs: dict[tuple[int, int], list] = {}
    offset = 0
    for t, (tree, n) in enumerate(zip(schedule.trees, sizes, strict=True)):
        base = offset
        offset += n
        if n == 0:
            continue
        par = tree.parents
        up, depth = up_depth(par)
        h = up[tree.root]
        kids = [c for c, p in enumerate(par) if p == rank]
        parent = par[rank]
        d = depth[rank]
        for k in range(chunks):
            lo, hi = (k * n) // chunks, ((k + 1) * n) // chunks
            if hi == lo:
                continue
            seg = (base + lo, hi - lo)
            if parent is not None:
                sends.setdefault((k + up[rank], parent), []).append(
                    (t, _REDUCE, k, *seg, _REDUCE))
                recvs.setdefault((k + h + d - 1, parent), []).append(
                    (t, _BCAST, k, *seg, _BCAST))
            for c in kids:
                recvs.setdefault((k + up[c], c), []).append((t, _REDUCE, k, *seg, _REDUCE))
                sends.setdefault((k + h + d, c), []).append((t, _BCAST, k, *seg, _BCAST))
    nsteps = 1 + max((s for s, _ in [*sends, *recvs]), default=-1)
    by_step: list[tuple[list[Message], list[Message]]] = [([], []) for _ in range(nsteps)]
    for table, side in ((sends, 0), (recvs, 1)):
        for (s, peer), items in sorted(table.items()):
            items.sort()
            pieces = tuple((o, ln, kd) for *_, o, ln, kd in items)
            by_step[s][side].append(Message(peer, pieces, sum(p[1] for p in pieces)))
    scratch = 0
    for snd, rcv in by_step:
        need = sum(m.length for m in snd if len(m.pieces) > 1)
        need += sum(m.length for m in rcv if len(m.pieces) > 1 or m.pieces[0][2] == _REDUCE)
        scratch = max(scratch, need)
    steps = tuple((tuple(s), tuple(r)) for s, r in by_step if s or r)
    return Program(rank, world, numel, chunks, steps, scratch)




def _layout(step: tuple[tuple[Message, ...], tuple[Message, ...]]) -> tuple[int, list[int]]:
    """Scratch offsets of one step: packed sends first, then the receives that need staging
    (several pieces, or a reduce piece that is added rather than received in place); -1 for a
    receive straight into the tensor. Returns (offset of the first receive, receive offsets)."""
    snd, rcv = step
    pos = sum(m.length for m in snd if len(m.pieces) > 1)
    first = pos
    offs = []
    for m in rcv:
        if len(m.pieces) == 1 and m.pieces[0][2] == _BCAST:
            offs.append(-1)
        else:
            offs.append(pos)
            pos += m.length
    return first, offs


def run_program(program: Program, flat: torch.Tensor, pg, lookahead: int = LOOKAHEAD) -> None:
    """Execute ``program`` on the contiguous 1-D ``flat`` (in place) over process group ``pg``
    (its ``send``/``recv`` take group ranks).

    Per step: post every send, add/copy each received message as it arrives, in step order.
    The receives of the next ``lookahead`` steps are posted ahead (gloo matches a peer's
    messages of one tag in posting order): gloo's TCP transport sends a message only after
    the receiver has announced the matching receive, so a receive posted late costs a round
    trip, and on a busy machine the receiver's turn on a core, before every message. Each
    in-flight step has its own staging slot; a slot's sends are waited for before the slot is
    reused. Receiving a broadcast piece straight into the tensor early is safe: it cannot
    arrive before this rank's reduce send of the same chunk has reached the parent (the
    root's broadcast of a chunk depends on it)."""
    steps = program.steps
    ahead = max(0, int(lookahead))
    slots = ahead + 1
    scratch = torch.empty(program.scratch * slots, dtype=flat.dtype, device=flat.device)
    posted: list = [None] * len(steps)  # per step: [(work, buf, pieces)] of its receives
    sends_of: list = [None] * len(steps)

    def post_recvs(i: int) -> None:
        base = (i % slots) * program.scratch
        prev = i - slots  # the step that used this slot before
        if prev >= 0 and sends_of[prev]:
            for work in sends_of[prev]:
                work.wait()
            sends_of[prev] = None
        _, offs = _layout(steps[i])
        out = []
        for m, off in zip(steps[i][1], offs, strict=True):
            if off < 0:
                o, ln, _ = m.pieces[0]
                out.append((pg.recv([flat[o : o + ln]], m.peer, TAG), None, None))
            else:
                buf = scratch[base + off : base + off + m.length]
                out.append((pg.recv([buf], m.peer, TAG), buf, m.pieces))
        posted[i] = out

    for i in range(min(ahead, len(steps))):
        post_recvs(i)
    for i, (snd, _rcv) in enumerate(steps):
        if posted[i] is None:
            post_recvs(i)
        if i + ahead < len(steps) and posted[i + ahead] is None:
            post_recvs(i + ahead)
        base = (i % slots) * program.scratch
        sends = []
        pos = base
        for m in snd:
            if len(m.pieces) == 1:
                o, ln, _ = m.pieces[0]
                buf = flat[o : o + ln]
            else:
                buf = scratch[pos : pos + m.length]
                pos += m.length
                torch.cat([flat[o : o + ln] for o, ln, _ in m.pieces], out=buf)
            sends.append(pg.send([buf], m.peer, TAG))
        sends_of[i] = sends
        # each received message is reduced/copied as soon as it is in, while the others are
        # still in flight: none of them touches what this step's sends read (other chunks)
        for work, buf, pieces in posted[i]:
            work.wait()
            if buf is None:
                continue
            b = 0
            for o, ln, kind in pieces:
                dst = flat[o : o + ln]
                if kind == _REDUCE:
                    torch.add(dst, buf[b : b + ln], out=dst)
                else:
                    dst.copy_(buf[b : b + ln])
                b += ln
        posted[i] = None
    for sends in sends_of:
        for work in sends or ():
            work.wait()


_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 64


def _program_for(schedule: TreeSchedule, numel: int, rank: int, chunks: int) -> Program:
    key = (id(schedule), numel, rank, chunks)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is schedule:
        _CACHE.move_to_end(key)
        return hit[1]
    prog = compile_program(schedule, numel, rank, chunks)
    _CACHE[key] = (schedule, prog)  # keeps the schedule alive: its id is not reused
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return prog


def tree_allreduce(
    tensor: torch.Tensor,
    schedule: TreeSchedule,
    group: dist.ProcessGroup | None = None,
    chunks: int | None = None,
    lookahead: int = LOOKAHEAD,
) -> torch.Tensor:
    """Sum ``tensor`` over all ranks of ``group`` in place, following ``schedule``.

    ``chunks`` (pipeline chunks per tree) defaults to :func:`chunk_count` (from the
    schedule's ``chunk_bytes``). Raises :class:`~topocontract.schedule.ScheduleMismatch`
    if the schedule was made for another world size. Programs are compiled once per (schedule,
    size, rank, chunks) and cached. ``lookahead``: steps whose receives are posted early
    (0: strictly one step at a time).
    """
    world = dist.get_world_size(group)
    check_world_size(schedule, world)
    if world == 1 or tensor.numel() == 0:
        return tensor
    rank = dist.get_rank(group)
    contiguous = tensor.is_contiguous()
    flat = tensor.view(-1) if contiguous else tensor.contiguous().view(-1)
    if chunks is None:
        chunks = chunk_count(schedule, flat.numel(), flat.element_size())
    prog = _program_for(schedule, flat.numel(), rank, chunks)
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    run_program(prog, flat, pg, lookahead)
    if not contiguous:
        tensor.copy_(flat.view(tensor.shape))
    return tensor
