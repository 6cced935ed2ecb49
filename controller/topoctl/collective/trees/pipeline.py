"""Cost model of the lock-step tree AllReduce runtime (``topotrain.collectives.program``) and
the choice of its pipeline depth. Pure functions over plain data; no I/O.

The runtime cuts every tree's partition into the same number ``C`` of chunks and runs
``S = max_t (C + 2 h_t - 1)`` lock-step steps (pipelined reduce then broadcast; Zhang, Wu, Li,
INFOCOM'21; the NCCL-style pipelined tree model ``(C + 2h - 1)(a + s/r)``). Predicted time of an
AllReduce of ``M`` bytes on trees of total rate ``R`` (bytes/s of goodput):

* network part ``U * M / (R C) + S * a``: in a step every tree moves one chunk,
  ``M x_t / (R C)`` bytes at its rate ``x_t`` (the same time ``M / (R C)`` on every tree, which
  is why all trees use the same ``C``), ``a`` the largest path latency of a tree edge; the
  bottleneck links are busy in every full step, and ``U`` counts the ``2h - 1`` fill/drain
  steps by how full their busiest link is (:func:`link_steps`; ``U = S`` without the links);
* CPU part, per rank ``r``: ``n_r * c_msg + p_r * c_piece + B^red_r / rho_red +
  B^copy_r / rho_copy + B^wire_r / rho_wire`` with ``n_r`` the point-to-point messages it posts
  (one per peer and direction per step, pieces of several trees packed: counted exactly as the
  union of each (peer, direction)'s step ranges), ``p_r`` the pieces it packs, adds or copies
  (one per tree edge, direction and chunk), ``B^red`` the bytes it adds, ``B^copy`` the bytes
  packed or unpacked, ``B^wire`` the bytes it sends and receives; the CPU costs ``c_*``,
  ``rho_*`` come from the machine's calibration (``python -m topotrain.collectives.calibrate``).
  Ranks that share the lab machine's ``cores`` cores (every rank on one machine; the
  machine's figures are a ``topoctl.labprofile.LabProfile``, passed in) stretch it by
  ``max(1, ranks / cores)``: the part is ``max(max_r cpu_r, sum_r cpu_r / cores)`` then, and
  a wire byte costs the lab's cable emulation too (``rho_wire`` becomes at most twice the
  profile's ``emulation_bytes_per_s``, wire bytes per core-second of veth + tc shaping + TCP
  at both ends, as iperf3 measured it: the bytes are counted at both ends).

The two parts overlap: the runtime posts the receives of the next steps ahead
(``topotrain.collectives.program.LOOKAHEAD``), so a rank's CPU work (posting, packing,
adding, and in the lab the cable emulation's kernel work) runs while other messages are in
flight, and the AllReduce takes ``max(network, CPU)``: whichever of the links and the cores is
the bottleneck. Measured on the quiet 2-core machine (hetero8, 8 ranks): a 15.9 MB
AllReduce, network 0.924 s / CPU 0.297 s, took 0.94 s; the demo's training iterations, trees
network 1.222 / CPU 0.365 s and topoopt 0.720 / 0.413 s, took 1.199 and 0.734 s (the sum
over-predicted them by 22-34%). The overlap needs CPU headroom: ``C`` is chosen to minimise
the *sum* of the two parts (deterministic scan), which keeps the cores well below saturation;
minimising the maximum instead picked 35 KB chunks for the demo's trees (CPU 0.437 s against
1.191 s of network) and the iteration took 1.336 s instead of 1.199 s (same day, same lab).
Complexity: ``O(T N)`` to build the shape, ``O(P log P)`` once and ``O(P)`` per candidate ``C``
(``P`` = tree-edge endpoints, ``2 T (N - 1)``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from topocontract.trees import up_depth
from topoctl.labprofile import DEFAULT_LAB, LabProfile

__all__ = [
    "RuntimeCosts",
    "TreePrediction",
    "TreeShape",
    "choose_chunks",
    "leave_fractions",
    "link_rows",
    "link_steps",
    "predict",
    "rank_cpu",
    "runtime_costs",
    "tree_shape",
]


@dataclass(frozen=True)
class RuntimeCosts:
    """CPU costs of the runtime on one core (calibrated per machine; defaults: a 2-core AMD
    EPYC VM, 2026-11, used when no calibration is cached). What the lab's cable emulation
    costs, and how many cores its ranks share, is the lab's (``topoctl.labprofile``)."""

    per_message_s: float = 70e-6
    wire_bytes_per_s: float = 5.5e9
    reduce_bytes_per_s: float = 20e9
    copy_bytes_per_s: float = 16e9
    per_piece_s: float = 8e-6
    source: str = "default"


def runtime_costs(calibration: dict | None) -> RuntimeCosts:
    """Costs from a calibration document (``topotrain.collectives.load_calibration()``), or the
    defaults when there is none (its ``cores`` and ``emulation_bytes_per_s`` are the lab
    profile's: ``topoctl.labprofile.profile_from_calibration``)."""
    if not calibration:
        return RuntimeCosts()
    return RuntimeCosts(
        per_message_s=float(calibration["per_message_s"]),
        wire_bytes_per_s=float(calibration["wire_bytes_per_s"]),
        reduce_bytes_per_s=float(calibration["reduce_bytes_per_s"]),
        copy_bytes_per_s=float(calibration["copy_bytes_per_s"]),
        per_piece_s=float(calibration.get("per_piece_s", RuntimeCosts.per_piece_s)),
        source=f"calibrated:{calibration.get('key', '?')}",
    )


@dataclass(frozen=True)
class TreeShape:
    """What the cost model needs of a schedule: per tree its fraction and height, and every
    (rank, peer, direction, tree, step offset) of a tree edge's messages (as numpy arrays)."""

    world_size: int
    fractions: tuple[float, ...]
    heights: tuple[int, ...]
    group: np.ndarray  # (rank * world + peer) * 2 + direction (0 send, 1 receive)
    offset: np.ndarray  # step of chunk 0 on that edge
    tree: np.ndarray
    reduce_in: np.ndarray  # per tree, per rank: children (pieces added per chunk)


def tree_shape(parents: Sequence[Sequence[int | None]], rates: Sequence[float]) -> TreeShape:
    """The message structure of the lock-step program (same step rule as
    ``topotrain.collectives.program.compile_program``): reduce ``r -> parent`` at ``k + up(r)``,
    broadcast ``parent -> r`` at ``k + h + depth(r) - 1``. O(T N)."""
    n = len(parents[0])
    total = float(sum(rates))
    g, o, t_of, heights = [], [], [], []
    red = np.zeros((len(parents), n))
    for t, par in enumerate(parents):
        up, depth = up_depth(par)
        h = up[next(r for r in range(n) if par[r] is None)]
        heights.append(h)
        for r, p in enumerate(par):
            if p is None:
                continue
            red[t, p] += 1
            # reduce r -> p at k + up(r): r sends, p receives
            g += [(r * n + p) * 2, (p * n + r) * 2 + 1]
            o += [up[r], up[r]]
            # broadcast p -> r at k + h + depth(r) - 1: p sends, r receives
            g += [(p * n + r) * 2, (r * n + p) * 2 + 1]
            o += [h + depth[r] - 1] * 2
            t_of += [t] * 4
    return TreeShape(n, tuple(x / total for x in rates), tuple(heights), np.array(g, np.int64),
                     np.array(o, np.int64), np.array(t_of, np.int64), red)


def _sends(shape: TreeShape) -> list[tuple[tuple[int, int], int, int]]:
    """Every directed tree edge of `shape` as ((sender, receiver), first step, tree)."""
    n = shape.world_size
    send = shape.group % 2 == 0
    pairs = (shape.group[send] // 2).tolist()
    return [((p // n, p % n), start, t) for p, start, t in
            zip(pairs, shape.offset[send].tolist(), shape.tree[send].tolist(), strict=True)]


def _link_index(sends: list[tuple[tuple[int, int], int, int]],
                uses: Mapping[tuple[int, int], Sequence[tuple[Hashable, float]]]
                ) -> dict[Hashable, int]:
    """Row of each link the `sends` cross, in order of first use."""
    index: dict[Hashable, int] = {}
    for pair, _, _ in sends:
        for link, _ in uses.get(pair, ()):
            index.setdefault(link, len(index))
    return index


def link_rows(shape: TreeShape,
              uses: Mapping[tuple[int, int], Sequence[tuple[Hashable, float]]]) -> list[Hashable]:
    """The link of each row of :func:`link_steps` (same arguments), in order: to give each
    link its own token credit (:func:`predict`'s ``credit_s`` as an array)."""
    return list(_link_index(_sends(shape), uses))


def link_steps(shape: TreeShape,
               uses: Mapping[tuple[int, int], Sequence[tuple[Hashable, float]]]) -> np.ndarray:
    """How full each link is in the fill and drain steps of the lock-step program, for
    :func:`predict`: ``A[l, k]`` is the share of link ``l``'s full-step load carried by the
    tree edges whose first step is at most ``k`` (``k = 0 .. D``, ``D = max_t (2 h_t - 1)``
    the last first step), scaled so that the busiest link's full-step load is 1. `uses` maps a
    directed rank pair (sender, receiver) to the links its messages cross with, per link,
    multipath weight / capacity (seconds per byte). A step in which only some of a link's
    tree edges are active (the pipeline filling or draining) is that much shorter than a full
    step. O(E P + L D) for E tree-edge directions over paths of P links."""
    frac = np.asarray(shape.fractions)
    sends = _sends(shape)
    depth = max((start for _, start, _ in sends), default=0)
    index = _link_index(sends, uses)
    rows, cols, vals = [], [], []
    for (a, b), start, t in sends:
        for link, per_byte in uses.get((a, b), ()):
            rows.append(index[link])
            cols.append(start)
            vals.append(frac[t] * per_byte)
    load = np.zeros((max(1, len(index)), depth + 1))
    np.add.at(load, (np.array(rows, np.int64), np.array(cols, np.int64)), np.array(vals))
    cum = np.cumsum(load, axis=1)
    full = float(cum[:, -1].max())
    return cum / full if full > 0 else cum


def _step_units(links: np.ndarray | None, chunks: int, depth: int,
                credit: float | np.ndarray = 0.0) -> float:
    """Sum over the program's steps of the busiest link's load in units of a full step (see
    :func:`link_steps`); every step is a full one without `links`. `credit`: the links' token
    credit in the same units, one for all or one per row of `links`
    (:func:`_credited_step_units`)."""
    c = chunks
    if links is None or links.shape[1] != depth + 1:
        return float(c + depth)
    if np.any(np.asarray(credit) > 0):
        return _credited_step_units(links, c, depth, credit)
    if c >= depth:  # every edge active together in the middle: fill, full steps, drain
        fill = links[:, :depth].max(axis=0).sum()
        drain = (links[:, depth:] - links[:, :depth]).max(axis=0).sum()
        return float(fill + (c - depth) + drain)
    steps = np.arange(c + depth)
    ended = steps - c  # edges with first step <= ended have sent their last chunk
    active = links[:, np.minimum(steps, depth)] - np.where(
        ended >= 0, links[:, np.clip(ended, 0, depth)], 0.0)
    return float(active.max(axis=0).sum())


def _credited_step_units(links: np.ndarray, chunks: int, depth: int,
                         credit: float | np.ndarray) -> float:
    """:func:`_step_units` on links that may send ``credit`` (units of a full step) at once
    after idling: a token bucket per link, full at the start, that fills while the link has
    nothing to send and is spent before the link's rate applies (the lab's tc HTB classes:
    ``topoctl.lab.commands.BURST_S``). A step lasts as long as its slowest link's load beyond
    its tokens. O(L (D + k)) for ``k`` middle steps until the tokens settle (a few)."""
    c, d = chunks, depth
    credit = np.broadcast_to(np.asarray(credit, dtype=float), links.shape[:1])
    tok = credit.copy()
    total = 0.0
    s, last = 0, c + d
    while s < last:
        ended = s - c
        need = links[:, min(s, d)] - (links[:, min(ended, d)] if ended >= 0 else 0.0)
        busy = np.maximum(need - tok, 0.0)
        step = float(busy.max())
        new = np.minimum(credit, tok - np.minimum(tok, need) + (step - busy))
        total += step
        s += 1
        if d <= s < c and np.array_equal(new, tok):  # settled in the middle: same from here
            total += step * (c - s)
            s = c
        tok = new
    return total


@dataclass(frozen=True)
class TreePrediction:
    """Seconds of one AllReduce; ``cpu_s`` already includes the core sharing."""

    chunks: int
    chunk_bytes: int  # chunk of the largest partition (the schedule's chunk_bytes)
    steps: int
    network_s: float
    cpu_s: float
    messages: int  # busiest rank's point-to-point messages
    share: float  # ranks per core (>= 1)

    @property
    def seconds(self) -> float:
        """Predicted AllReduce time: the network part and the CPU part overlap, the larger
        one is the time."""
        return max(self.network_s, self.cpu_s)

    @property
    def exposed_cpu_s(self) -> float:
        """The CPU part's excess over the network part: what the CPU adds to the transfers."""
        return max(0.0, self.cpu_s - self.network_s)

    def as_dict(self) -> dict:
        """The prediction as plain data (for plans and `explain`), with the total."""
        return asdict(self) | {"seconds": self.seconds, "exposed_cpu_s": self.exposed_cpu_s}


def leave_fractions(shape: TreeShape, chunks: int) -> tuple[float, ...]:
    """Per rank, the share of the lock-step program's ``S = C + D`` steps after which it has
    sent and received its last message and leaves the AllReduce: ``(last_r + 1) / S`` with
    ``last_r`` its last step, ``C - 1 +`` the largest step offset of its tree edges (a
    leaf's last broadcast receive, an inner rank's last broadcast send). The roots and shallow
    ranks of every tree leave first; the deepest leaves take the whole program. Steps are
    counted as equal (fill and drain steps may be shorter: :func:`link_steps`). O(P) for P
    tree-edge endpoints."""
    n = shape.world_size
    c = max(1, int(chunks))
    if not shape.heights or not shape.offset.size:
        return (1.0,) * n
    steps = c + max(2 * h - 1 for h in shape.heights)
    last = np.full(n, -1, np.int64)
    np.maximum.at(last, shape.group // 2 // n, shape.offset + c - 1)
    return tuple(float(min(steps, x + 1) / steps) if x >= 0 else 0.0 for x in last)


def _messages_per_rank(shape: TreeShape, chunks: int) -> np.ndarray:
    """Messages each rank posts: per (peer, direction) the union of ``[offset, offset + C)``
    over the trees that use it."""
    n = shape.world_size
    if shape.group.size == 0:
        return np.zeros(n)
    order = np.lexsort((shape.offset, shape.group))
    grp, off = shape.group[order], shape.offset[order]
    new = np.ones(grp.size, bool)
    new[1:] = grp[1:] != grp[:-1]
    gap = np.empty(grp.size, np.int64)
    gap[0] = chunks
    gap[1:] = off[1:] - off[:-1]
    per = np.where(new, chunks, np.minimum(gap, chunks))
    rank = grp // 2 // n
    return np.bincount(rank, weights=per, minlength=n)


def predict(
    shape: TreeShape,
    nbytes: float,
    rate: float,
    chunks: int,
    costs: RuntimeCosts,
    ranks_per_machine: int = 1,
    latency_s: float = 0.0,
    links: np.ndarray | None = None,
    credit_s: float | np.ndarray = 0.0,
    lab: LabProfile = DEFAULT_LAB,
) -> TreePrediction:
    """Predicted time of one tree AllReduce of ``nbytes`` at total tree rate ``rate`` (bytes/s
    of goodput) with ``chunks`` chunks per tree. ``ranks_per_machine`` ranks share
    ``lab.cores`` cores (1: every rank has its own core; all of them: the lab, whose wire
    bytes also cost ``lab``'s cable emulation). `links` (:func:`link_steps`):
    fill and drain steps as long as their busiest link's load; without it, full steps.
    ``credit_s``: seconds of token credit each link has at its rate (the lab's shaped cables;
    0 for real links), spent in the steps after a link idled: one for all links, or one per
    row of `links` (:func:`link_rows`; the lab's slow cables have more than ``BURST_S``)."""
    c = max(1, int(chunks))
    depth = max(2 * h - 1 for h in shape.heights) if shape.heights else 0
    steps = c + depth if shape.heights else 0
    if nbytes <= 0 or rate <= 0:
        return TreePrediction(c, 0, 0, 0.0, 0.0, 0, 1.0)
    full = nbytes / (rate * c)  # seconds of a full step
    network = _step_units(links, c, depth, np.asarray(credit_s) / full) * full + steps * latency_s
    n = shape.world_size
    msgs = _messages_per_rank(shape, c)
    in_lab = ranks_per_machine >= n > 1  # every rank on one machine (the lab)
    cpu = rank_cpu(shape, nbytes, c, costs, lab if in_lab else None)
    share = max(1.0, ranks_per_machine / lab.cores)
    if in_lab:  # its cores run every rank
        cpu_s = max(float(cpu.max()), float(cpu.sum()) / lab.cores)
    else:
        cpu_s = float(cpu.max()) * share
    biggest = max(shape.fractions, default=0.0) * nbytes
    return TreePrediction(c, max(1, math.floor(biggest / c)), steps, network, cpu_s,
                          int(msgs.max()), share)


def rank_cpu(shape: TreeShape, nbytes: float, chunks: int, costs: RuntimeCosts,
             lab: LabProfile | None = None) -> np.ndarray:
    """CPU seconds each rank spends in one tree AllReduce of ``nbytes`` in ``chunks`` chunks
    per tree, on one core (module docstring: messages, pieces, bytes added, copied and on the
    wire); ``lab``: every rank on that lab machine, whose cable emulation a wire byte costs
    too. O(P) for P tree-edge endpoints."""
    n = shape.world_size
    c = max(1, int(chunks))
    if nbytes <= 0 or shape.group.size == 0:
        return np.zeros(n)
    msgs = _messages_per_rank(shape, c)
    part = np.asarray(shape.fractions) * nbytes
    # bytes each rank adds: its children's pieces
    red = (shape.reduce_in * part[:, None]).sum(axis=0)
    # bytes on the wire per rank (sent + received) and bytes packed/unpacked: every piece
    # of a (peer, direction) that more than one tree uses is copied once
    rank = shape.group // 2 // n
    pbytes = part[shape.tree]
    wire = np.bincount(rank, weights=pbytes, minlength=n)
    counts = np.bincount(shape.group, minlength=2 * n * n)
    shared = counts[shape.group] > 1
    copy = np.bincount(rank, weights=np.where(shared, pbytes, 0.0), minlength=n)
    # pieces: every (tree edge, direction) entry of the rank moves one piece per chunk (a
    # slice and a torch call to pack, add or copy it)
    pieces = np.bincount(rank, minlength=n) * min(c, max(1, int(nbytes)))
    # in the lab a wire byte also costs the cable emulation; wire_r counts it at both ends
    wire_rate = (lab.wire_rate(costs.wire_bytes_per_s) if lab is not None
                 else costs.wire_bytes_per_s)
    return (msgs * costs.per_message_s + pieces * costs.per_piece_s
            + red / costs.reduce_bytes_per_s
            + copy / costs.copy_bytes_per_s + wire / wire_rate)


def choose_chunks(
    shape: TreeShape,
    nbytes: float,
    rate: float,
    costs: RuntimeCosts,
    ranks_per_machine: int = 1,
    latency_s: float = 0.0,
    max_chunks: int = 4096,
    links: np.ndarray | None = None,
    credit_s: float | np.ndarray = 0.0,
    lab: LabProfile = DEFAULT_LAB,
) -> TreePrediction:
    """The chunk count minimising network + CPU part of :func:`predict` over ``C`` in
    ``1..max_chunks`` (every count up to 64, then a geometric grid), first minimum kept;
    chunks are at least 4 KiB of the largest partition (`lab`: as :func:`predict`).
    Deterministic."""
    biggest = max(shape.fractions) * nbytes if shape.fractions else 0.0
    top = int(max(1, min(max_chunks, biggest // 4096)))
    cands = list(range(1, min(top, 64) + 1))
    c = 64.0
    while c < top:
        c *= 1.125
        cands.append(min(top, int(c)))
    best = None
    for c in sorted(set(cands)):
        p = predict(shape, nbytes, rate, c, costs, ranks_per_machine, latency_s, links,
                    credit_s, lab)
        cost = p.network_s + p.cpu_s  # conservative: see the module docstring
        if best is None or cost < (best.network_s + best.cpu_s) * (1 - 1e-12):
            best = p
    return best
