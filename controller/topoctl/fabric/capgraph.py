"""Capacitated fabric graphs for collective planning.

A fabric is a set of full-duplex links ``(u, v, capacity)`` (capacity per direction, any unit)
and a set of *workers*; every other node is a switch that only forwards. Parallel links are
merged (capacities summed). Each link is two arcs: arc ``2k`` is ``u -> v`` and arc ``2k + 1``
is ``v -> u`` for edge ``k``.

Pure functions over plain data (numpy arrays); building is O(m log m).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from topoagent.protocol import TopoError

__all__ = ["CapGraph", "FabricError", "build_capgraph", "read_edges"]


class FabricError(TopoError, ValueError):
    """The fabric cannot carry a collective (disconnected, bad capacity, unknown worker...)."""


@dataclass(frozen=True)
class CapGraph:
    """An undirected capacitated multigraph with parallel links merged.

    ``nodes[i]`` is the label of node ``i``; ``workers`` are node indices (in the caller's
    order: rank ``r`` is ``workers[r]``); edge ``k`` joins ``u[k] < v[k]`` with capacity
    ``cap[k]`` in each direction.
    """

    nodes: tuple[Hashable, ...]
    workers: tuple[int, ...]
    u: np.ndarray
    v: np.ndarray
    cap: np.ndarray

    @property
    def n(self) -> int:
        """Number of nodes (workers and switches)."""
        return len(self.nodes)

    @property
    def m(self) -> int:
        """Number of links (parallel links merged)."""
        return int(self.u.shape[0])

    @property
    def is_direct(self) -> bool:
        """True when every node is a worker (a direct-connect fabric)."""
        return len(self.workers) == self.n

    def arc_tails_heads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Arrays (tail, head, capacity) of the 2m arcs, arc 2k = u->v, 2k+1 = v->u."""
        tail = np.empty(2 * self.m, dtype=np.int64)
        head = np.empty(2 * self.m, dtype=np.int64)
        tail[0::2], head[0::2] = self.u, self.v
        tail[1::2], head[1::2] = self.v, self.u
        return tail, head, np.repeat(self.cap, 2)

    def edge_index(self) -> dict[tuple[int, int], int]:
        """Map (a, b) with a < b to the edge id."""
        return {(int(a), int(b)): k for k, (a, b) in enumerate(zip(self.u, self.v, strict=True))}

    def ingress(self) -> np.ndarray:
        """Total incoming capacity per node (sum of its links' capacities)."""
        out = np.zeros(self.n)
        np.add.at(out, self.u, self.cap)
        np.add.at(out, self.v, self.cap)
        return out


def build_capgraph(
    links: Iterable[tuple[Hashable, Hashable, float]],
    workers: Sequence[Hashable] | None = None,
) -> CapGraph:
    """Build and validate a :class:`CapGraph`.

    ``workers=None`` makes every node a worker (direct connect). Raises :class:`FabricError`
    for zero, negative or non-finite capacities, self-loops, unknown or duplicate workers,
    a worker without links, fewer than two workers, and a fabric in which the workers are not
    all connected.
    """
    index: dict[Hashable, int] = {}
    merged: dict[tuple[int, int], float] = {}
    for num, link in enumerate(links):
        try:
            a, b, c = link
            cap = float(c)
        except (TypeError, ValueError) as exc:
            raise FabricError(f"link {num}: expected (u, v, capacity), got {link!r}") from exc
        if not math.isfinite(cap) or cap <= 0:
            raise FabricError(f"link {num} ({a}-{b}): capacity must be > 0, got {c!r}")
        if a == b:
            raise FabricError(f"link {num}: self-loop on {a!r}")
        ia = index.setdefault(a, len(index))
        ib = index.setdefault(b, len(index))
        key = (min(ia, ib), max(ia, ib))
        merged[key] = merged.get(key, 0.0) + cap
    nodes = tuple(index)
    if workers is None:
        widx = tuple(range(len(nodes)))
    else:
        seen: set[Hashable] = set()
        wl = []
        for w in workers:
            if w in seen:
                raise FabricError(f"worker {w!r} listed twice")
            seen.add(w)
            if w not in index:
                raise FabricError(f"worker {w!r} has no links")
            wl.append(index[w])
        widx = tuple(wl)
    if len(widx) < 2:
        raise FabricError(f"need at least two workers, got {len(widx)}")
    keys = sorted(merged)
    u = np.array([k[0] for k in keys], dtype=np.int64)
    v = np.array([k[1] for k in keys], dtype=np.int64)
    cap = np.array([merged[k] for k in keys], dtype=float)
    g = CapGraph(nodes=nodes, workers=widx, u=u, v=v, cap=cap)
    adj = csr_matrix((np.ones(g.m), (u, v)), shape=(g.n, g.n))
    _, label = connected_components(adj, directed=False)
    comp = {int(label[w]) for w in widx}
    if len(comp) > 1:
        groups: dict[int, list[Hashable]] = {}
        for w in widx:
            groups.setdefault(int(label[w]), []).append(nodes[w])
        parts = " | ".join(", ".join(map(str, ws[:5])) for ws in groups.values())
        raise FabricError(f"fabric is disconnected: workers fall into {len(comp)} parts: {parts}")
    return g


def read_edges(lines: Iterable[str]) -> list[tuple[str, str, float]]:
    """Parse ``u v capacity`` lines ('#' comments and blank lines ignored)."""
    out: list[tuple[str, str, float]] = []
    for num, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3:
            raise FabricError(f"line {num}: expected 'u v capacity', got {raw.strip()!r}")
        try:
            cap = float(parts[2])
        except ValueError as exc:
            raise FabricError(f"line {num}: capacity {parts[2]!r} is not a number") from exc
        out.append((parts[0], parts[1], cap))
    return out
