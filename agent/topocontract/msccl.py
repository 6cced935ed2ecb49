"""MSCCL algorithm programs: the data, their XML form and the executor's limits.

The controller writes them (`topoctl export nccl`, one file per planned collective); GPUs run
them with msccl-executor-nccl (``MSCCL_ALGO_DIR``/``MSCCL_XML_FILES``), and
`topotrain.collectives.msccl` runs the same file over torch.distributed send/recv, which is how
they are checked on machines without GPUs. The format (msccl-tools' ``ir_to_xml``, the
"old format" the executor's parser reads)::

    <algo name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes>
      <gpu id i_chunks o_chunks s_chunks>
        <tb id send recv chan>
          <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/>

Semantics, per rank, of the buffer cut into ``nchunksperloop`` equal chunks (``i`` input, ``o``
output, ``s`` scratch; one buffer when ``inplace``): a thread block runs its steps in order,
sending to its ``send`` peer and receiving from its ``recv`` peer on channel ``chan`` (FIFO per
peer pair and channel); a step first waits for step ``deps`` of thread block ``depid`` of its
own rank (``depid`` -1: none); ``hasdep`` 1 marks a step another one waits for. Types: ``s``
send src; ``r`` recv into dst; ``rcs`` recv into dst and send it on; ``rrs`` recv, add src,
send the sum; ``rrc`` dst = src + recv; ``rrcs`` dst = src + recv, send it on; ``cpy`` dst = src;
``re`` dst = dst + src; ``nop`` only waits. ``cnt`` consecutive chunks move at once.

Limits are compiled into the executor (msccl-executor-nccl: src/include/msccl/msccl_struct.h,
src/include/device.h, src/include/msccl/msccl_parser.h, makefiles/common.mk); `Limits` holds
them with those defaults, and `check` names every one a program exceeds.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field

from topoagent.protocol import TopoError

__all__ = ["BUFFERS", "COLLECTIVES", "SEND_TYPES", "RECV_TYPES", "STEP_TYPES", "Gpu", "Limits",
           "MscclError", "Program", "Step", "ThreadBlock", "check", "from_xml", "link_chunks",
           "to_xml"]

STEP_TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
SEND_TYPES = frozenset({"s", "rcs", "rrs", "rrcs"})
RECV_TYPES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
BUFFERS = ("i", "o", "s")
COLLECTIVES = ("allreduce", "allgather", "reducescatter")


class MscclError(TopoError, ValueError):
    """An MSCCL program is malformed or exceeds the executor's limits."""


@dataclass(frozen=True)
class Limits:
    """What msccl-executor-nccl accepts, as compiled by default.

    ``max_steps``: MSCCL_MAX_NUM_STEPS (makefiles/common.mk, 64; builds may raise it, e.g. 256);
    ``max_tbs_per_channel``: MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL (32); ``max_channels``:
    MAXCHANNELS (32); ``max_count``: a step's ``cnt`` must be below MSCCL_MAX_COUNT (72);
    ``max_nodes``: the XML parser's MAX_NODES (4096 elements)."""

    max_steps: int = 64
    max_tbs_per_channel: int = 32
    max_channels: int = 32
    max_count: int = 72
    max_nodes: int = 4096


@dataclass(frozen=True)
class Step:
    """One instruction of a thread block (attributes as in the XML)."""

    type: str
    srcbuf: str = "i"
    srcoff: int = -1
    dstbuf: str = "o"
    dstoff: int = -1
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: int = 0


@dataclass
class ThreadBlock:
    """A sequence of steps with one send peer and one receive peer (-1: none) on a channel."""

    id: int
    send: int
    recv: int
    chan: int
    steps: list[Step] = field(default_factory=list)


@dataclass
class Gpu:
    """One rank's part of the program: its buffer sizes in chunks and its thread blocks."""

    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int = 0
    tbs: list[ThreadBlock] = field(default_factory=list)


@dataclass
class Program:
    """A whole MSCCL algorithm (``<algo>``)."""

    name: str
    coll: str
    nchunksperloop: int
    gpus: list[Gpu]
    proto: str = "Simple"
    inplace: int = 1
    min_bytes: int = 0
    max_bytes: int = 0

    @property
    def ngpus(self) -> int:
        """Ranks the program is written for."""
        return len(self.gpus)

    @property
    def nchannels(self) -> int:
        """Channels the program uses (the largest ``chan`` plus one)."""
        return 1 + max((tb.chan for g in self.gpus for tb in g.tbs), default=-1)


def to_xml(program: Program) -> str:
    """The program as msccl-executor-nccl's XML (deterministic: same program, same bytes)."""
    algo = ET.Element("algo", {
        "name": program.name, "proto": program.proto, "nchannels": str(program.nchannels),
        "nchunksperloop": str(program.nchunksperloop), "ngpus": str(program.ngpus),
        "coll": program.coll, "inplace": str(program.inplace),
        "outofplace": str(1 - program.inplace), "minBytes": str(program.min_bytes),
        "maxBytes": str(program.max_bytes)})
    for g in program.gpus:
        ge = ET.SubElement(algo, "gpu", {"id": str(g.id), "i_chunks": str(g.i_chunks),
                                         "o_chunks": str(g.o_chunks), "s_chunks": str(g.s_chunks)})
        for tb in g.tbs:
            te = ET.SubElement(ge, "tb", {"id": str(tb.id), "send": str(tb.send),
                                          "recv": str(tb.recv), "chan": str(tb.chan)})
            for s, st in enumerate(tb.steps):
                ET.SubElement(te, "step", {
                    "s": str(s), "type": st.type, "srcbuf": st.srcbuf, "srcoff": str(st.srcoff),
                    "dstbuf": st.dstbuf, "dstoff": str(st.dstoff), "cnt": str(st.cnt),
                    "depid": str(st.depid), "deps": str(st.deps), "hasdep": str(st.hasdep)})
    ET.indent(algo, space="  ")
    return ET.tostring(algo, encoding="unicode") + "\n"


def _int(el: ET.Element, name: str, where: str) -> int:
    raw = el.get(name)
    if raw is None:
        raise MscclError(f"{where}: attribute {name!r} missing")
    try:
        return int(raw)
    except ValueError:
        raise MscclError(f"{where}: {name}={raw!r} is not an integer") from None


def _steps_of(te: ET.Element, where: str) -> list[Step]:
    steps: list[Step] = []
    for k, se in enumerate(te.findall("step")):
        at = f"{where}.step[{k}]"
        if _int(se, "s", at) != k:
            raise MscclError(f"{at}: s={se.get('s')} but steps must be numbered 0, 1, ... in order")
        steps.append(Step(type=se.get("type", ""), srcbuf=se.get("srcbuf", ""),
                          srcoff=_int(se, "srcoff", at), dstbuf=se.get("dstbuf", ""),
                          dstoff=_int(se, "dstoff", at), cnt=_int(se, "cnt", at),
                          depid=_int(se, "depid", at), deps=_int(se, "deps", at),
                          hasdep=_int(se, "hasdep", at)))
    return steps


def from_xml(text: str) -> Program:
    """Parse an MSCCL XML program (the shape `to_xml` writes); MscclError names what is wrong."""
    try:
        algo = ET.fromstring(text)
    except ET.ParseError as exc:
        raise MscclError(f"not well-formed XML: {exc}") from None
    if algo.tag != "algo":
        raise MscclError(f"top element is <{algo.tag}>, expected <algo>")
    gpus = []
    for ge in algo.findall("gpu"):
        where = f"gpu[{len(gpus)}]"
        tbs = [ThreadBlock(id=_int(te, "id", f"{where}.tb[{t}]"), send=_int(te, "send", where),
                           recv=_int(te, "recv", where), chan=_int(te, "chan", where),
                           steps=_steps_of(te, f"{where}.tb[{t}]"))
               for t, te in enumerate(ge.findall("tb"))]
        gpus.append(Gpu(id=_int(ge, "id", where), i_chunks=_int(ge, "i_chunks", where),
                        o_chunks=_int(ge, "o_chunks", where),
                        s_chunks=_int(ge, "s_chunks", where), tbs=tbs))
    program = Program(name=algo.get("name", ""), coll=algo.get("coll", ""),
                      nchunksperloop=_int(algo, "nchunksperloop", "algo"), gpus=gpus,
                      proto=algo.get("proto", ""), inplace=_int(algo, "inplace", "algo"),
                      min_bytes=_int(algo, "minBytes", "algo"),
                      max_bytes=_int(algo, "maxBytes", "algo"))
    declared = (_int(algo, "ngpus", "algo"), _int(algo, "nchannels", "algo"))
    if declared != (program.ngpus, program.nchannels):
        raise MscclError(f"algo: ngpus/nchannels {declared} but the program has "
                         f"{program.ngpus} gpus on {program.nchannels} channels")
    return program


def _buffer_problems(g: Gpu, where: str, buf: str, off: int, cnt: int) -> Iterator[str]:
    size = {"i": g.i_chunks, "o": g.o_chunks, "s": g.s_chunks}.get(buf)
    if size is None:
        yield f"{where}: buffer {buf!r} is not one of i, o, s"
    elif off < 0 or off + cnt > size:
        yield f"{where}: chunks {off}..{off + cnt - 1} of buffer {buf!r} outside its {size}"


def _step_problems(p: Program, g: Gpu, tb: ThreadBlock, s: int, st: Step,
                   lim: Limits) -> Iterator[str]:
    where = f"gpu {g.id} tb {tb.id} step {s}"
    if st.type not in STEP_TYPES:
        yield f"{where}: type {st.type!r} is not one of {', '.join(STEP_TYPES)}"
        return
    if st.type != "nop" and not 0 < st.cnt < lim.max_count:
        yield (f"{where}: cnt {st.cnt} must be 1..{lim.max_count - 1} (MSCCL_MAX_COUNT "
               f"{lim.max_count}): split the step")
    if st.type in SEND_TYPES and tb.send < 0:
        yield f"{where}: {st.type} sends but the thread block has no send peer"
    if st.type in RECV_TYPES and tb.recv < 0:
        yield f"{where}: {st.type} receives but the thread block has no recv peer"
    if st.type in {"s", "rrs", "rrc", "rrcs", "cpy", "re"}:
        yield from _buffer_problems(g, where, st.srcbuf, st.srcoff, st.cnt)
    if st.type in {"r", "rcs", "rrc", "rrcs", "cpy", "re"}:
        yield from _buffer_problems(g, where, st.dstbuf, st.dstoff, st.cnt)
    if st.depid >= 0:
        dep = next((t for t in g.tbs if t.id == st.depid), None)
        if dep is None or not 0 <= st.deps < len(dep.steps):
            yield f"{where}: waits for tb {st.depid} step {st.deps}, which does not exist"
        elif dep.steps[st.deps].hasdep != 1:
            yield f"{where}: waits for tb {st.depid} step {st.deps}, which has no hasdep=1"


def _tb_problems(p: Program, g: Gpu, tb: ThreadBlock, lim: Limits) -> Iterator[str]:
    where = f"gpu {g.id} tb {tb.id}"
    for peer in (tb.send, tb.recv):
        if peer == g.id or not -1 <= peer < p.ngpus:
            yield f"{where}: peer {peer} must be another rank < {p.ngpus} or -1"
    if not 0 <= tb.chan < lim.max_channels:
        yield f"{where}: channel {tb.chan} outside 0..{lim.max_channels - 1} (MAXCHANNELS)"
    if len(tb.steps) > lim.max_steps:
        yield (f"{where}: {len(tb.steps)} steps, the executor takes at most {lim.max_steps} "
               "(MSCCL_MAX_NUM_STEPS): coarsen the schedule (fewer chunks, trees or ranks per "
               "ring) or use an executor built with a larger MSCCL_MAX_NUM_STEPS")
    for s, st in enumerate(tb.steps):
        yield from _step_problems(p, g, tb, s, st, lim)


def _gpu_problems(p: Program, g: Gpu, lim: Limits) -> Iterator[str]:
    if sorted(tb.id for tb in g.tbs) != list(range(len(g.tbs))):
        yield f"gpu {g.id}: thread block ids must be 0..{len(g.tbs) - 1} without gaps"
    per_chan: dict[int, int] = {}
    for side in ("send", "recv"):
        seen: set[tuple[int, int]] = set()
        for tb in g.tbs:
            key = (getattr(tb, side), tb.chan)
            if key[0] >= 0 and key in seen:
                yield (f"gpu {g.id}: two thread blocks {side} peer {key[0]} on channel {key[1]}"
                       " (one connection each way per peer and channel)")
            seen.add(key)
    for tb in g.tbs:
        per_chan[tb.chan] = per_chan.get(tb.chan, 0) + 1
    for chan, n in sorted(per_chan.items()):
        if n > lim.max_tbs_per_channel:
            yield (f"gpu {g.id}: {n} thread blocks on channel {chan}, at most "
                   f"{lim.max_tbs_per_channel} (MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL)")
    for tb in g.tbs:
        yield from _tb_problems(p, g, tb, lim)


def _pairing_problems(p: Program) -> Iterator[str]:
    """Every send on (a -> b, channel) is matched by a receive on b, in the same count."""
    sent: dict[tuple[int, int, int], list[int]] = {}
    got: dict[tuple[int, int, int], list[int]] = {}
    for g in p.gpus:
        for tb in g.tbs:
            for st in tb.steps:
                if st.type in SEND_TYPES:
                    sent.setdefault((g.id, tb.send, tb.chan), []).append(st.cnt)
                if st.type in RECV_TYPES:
                    got.setdefault((tb.recv, g.id, tb.chan), []).append(st.cnt)
    for key in sorted(set(sent) | set(got)):
        if sent.get(key, []) != got.get(key, []):
            a, b, c = key
            yield (f"rank {a} -> rank {b} on channel {c}: sends of {sent.get(key, [])} chunks, "
                   f"receives of {got.get(key, [])}")


def check(program: Program, limits: Limits = Limits()) -> list[str]:
    """Every way `program` is malformed or exceeds `limits`, as sentences (empty: valid)."""
    problems: list[str] = []
    if program.coll not in COLLECTIVES:
        problems.append(f"coll {program.coll!r} is not one of {', '.join(COLLECTIVES)}")
    if [g.id for g in program.gpus] != list(range(program.ngpus)):
        problems.append("gpu ids must be 0..ngpus-1 in order")
    if program.nchannels > limits.max_channels:
        problems.append(f"{program.nchannels} channels, at most {limits.max_channels} "
                        "(MAXCHANNELS): fewer trees or rings")
    nodes = 1 + sum(1 + len(g.tbs) + sum(len(tb.steps) for tb in g.tbs) for g in program.gpus)
    if nodes > limits.max_nodes:
        problems.append(f"{nodes} XML elements, the executor's parser reads at most "
                        f"{limits.max_nodes} (MAX_NODES): coarsen the schedule")
    for g in program.gpus:
        problems.extend(_gpu_problems(program, g, limits))
    problems.extend(_pairing_problems(program))
    return problems


def link_chunks(program: Program) -> dict[tuple[int, int], int]:
    """Chunks each (sender, receiver) rank pair carries in one run of the program."""
    out: dict[tuple[int, int], int] = {}
    for g in program.gpus:
        for tb in g.tbs:
            for st in tb.steps:
                if st.type in SEND_TYPES:
                    out[(g.id, tb.send)] = out.get((g.id, tb.send), 0) + st.cnt
    return out

