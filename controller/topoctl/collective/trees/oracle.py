"""Minimum-spanning-tree oracles for spanning-tree packing (the pricing step).

A *column* is one spanning tree over the workers together with the resources it uses: in a
direct-connect fabric the rows are the undirected links (a tree edge uses both arcs of its link
equally: reduce child->parent, broadcast parent->child); with switches the rows are arcs and a
tree edge ``{a, b}`` uses the routed path ``a -> b`` and the routed path ``b -> a``.

Given row lengths ``y >= 0`` the oracle returns the column of minimum total length
``sum_r count_r * y_r``: an MST (Kruskal/Prim in scipy, O(m log n)) in the direct case; in the
switched case Dijkstra from every worker under ``y`` (O(W m log n)) and an MST of the workers'
metric closure (O(W^2)), as in Blink (MLSys'20) and the INFOCOM'21 paper's forest packing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra, minimum_spanning_tree

from topoctl.fabric.capgraph import CapGraph

__all__ = ["Column", "Oracle", "make_oracle"]

_EPS = 1e-12  # keeps zero-length rows as edges (scipy drops explicit zeros)


@dataclass
class Column:
    """One spanning tree: resource rows used (with multiplicities), tree edges between worker
    node indices, and the routed node paths ``(a->b, b->a)`` of edges that are not links."""

    rows: np.ndarray
    counts: np.ndarray
    edges: list[tuple[int, int]]
    paths: dict[tuple[int, int], tuple[list[int], list[int]]] = field(default_factory=dict)
    weight: float = 0.0

    @property
    def key(self) -> bytes:
        """Bytes identifying the column (its rows and counts), for de-duplication."""
        return self.rows.tobytes() + self.counts.tobytes()


class Oracle:
    """Pricing oracle bound to one fabric. ``capacity`` is the per-row capacity vector."""

    def __init__(self, g: CapGraph):
        self.g = g
        self.direct = g.is_direct
        self._ekey = g.u * g.n + g.v  # sorted, since edges are sorted by (u, v)
        if self.direct:
            self.capacity = g.cap.copy()
        else:
            self._tail, self._head, self.capacity = g.arc_tails_heads()
            self._w = np.asarray(g.workers, dtype=np.int64)

    @property
    def rows(self) -> int:
        """Number of capacity rows (resources a tree can use)."""
        return int(self.capacity.shape[0])

    def _edge_ids(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        return np.searchsorted(self._ekey, lo * self.g.n + hi)

    def __call__(self, y: np.ndarray) -> Column:
        top = float(y.max()) if y.size else 0.0
        z = y / top if top > 0 else np.zeros_like(y)  # MST/Dijkstra are scale invariant
        col = self._direct(z) if self.direct else self._switched(z)
        col.weight = float((y[col.rows] * col.counts).sum())
        return col

    def _direct(self, y: np.ndarray) -> Column:
        g = self.g
        mat = csr_matrix((y + _EPS, (g.u, g.v)), shape=(g.n, g.n))
        t = minimum_spanning_tree(mat).tocoo()
        rows = np.sort(self._edge_ids(t.row.astype(np.int64), t.col.astype(np.int64)))
        edges = [(int(g.u[k]), int(g.v[k])) for k in rows]
        return Column(rows, np.ones(len(rows)), edges, {}, float(y[rows].sum()))

    def _switched(self, y: np.ndarray) -> Column:
        g, w = self.g, self._w
        mat = csr_matrix((y + _EPS, (self._tail, self._head)), shape=(g.n, g.n))
        dist, pred = dijkstra(mat, directed=True, indices=w, return_predecessors=True)
        d = dist[:, w]
        iu, ju = np.triu_indices(len(w), 1)
        # sparse input: scipy's dense path drops entries below ~1e-8
        sym = csr_matrix((d[iu, ju] + d[ju, iu], (iu, ju)), shape=(len(w), len(w)))
        t = minimum_spanning_tree(sym).tocoo()
        pairs = list(zip(t.row.tolist(), t.col.tolist(), strict=True))
        return self._routed(pairs, pred, y)

    def _routed(self, pairs: list[tuple[int, int]], pred: np.ndarray, y: np.ndarray) -> Column:
        """Column of worker-position pairs (i, j), routed along ``pred`` rows (row i: paths
        from workers[i])."""
        w = self._w
        used: dict[int, float] = {}
        edges: list[tuple[int, int]] = []
        paths: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        for i, j in pairs:
            a, b = int(w[i]), int(w[j])
            pab = _path(pred[i], a, b)  # row i of pred: Dijkstra from a
            pba = _path(pred[j], b, a)
            for p in (pab, pba):
                for r in self._arcs(p).tolist():
                    used[r] = used.get(r, 0.0) + 1.0
            edges.append((a, b))
            if len(pab) > 2 or len(pba) > 2:
                paths[(a, b)] = (pab, pba)
        rows = np.array(sorted(used), dtype=np.int64)
        counts = np.array([used[r] for r in rows.tolist()])
        return Column(rows, counts, edges, paths, float((y[rows] * counts).sum()))

    def column_for(
        self, pairs: list[tuple[int, int]], arc_weight: np.ndarray | None = None
    ) -> Column:
        """The column of a given spanning tree, as pairs of worker positions (ranks).

        Direct fabrics: every pair must be a link. Switched: pairs are routed on shortest paths
        under ``arc_weight`` (default: fewest hops).
        """
        y = np.zeros(self.rows)
        if self.direct:
            w = np.asarray(self.g.workers)
            a = w[[p[0] for p in pairs]]
            b = w[[p[1] for p in pairs]]
            keys = np.minimum(a, b) * self.g.n + np.maximum(a, b)
            idx = np.searchsorted(self._ekey, keys)
            if np.any(idx >= len(self._ekey)) or np.any(self._ekey[np.minimum(
                    idx, len(self._ekey) - 1)] != keys):
                raise ValueError("a tree edge is not a link")
            rows = np.sort(idx)
            edges = [(int(self.g.u[k]), int(self.g.v[k])) for k in rows]
            return Column(rows, np.ones(len(rows)), edges, {}, 0.0)
        wts = np.ones(len(self._tail)) if arc_weight is None else arc_weight
        hops = csr_matrix((wts, (self._tail, self._head)), shape=(self.g.n, self.g.n))
        _, pred = dijkstra(hops, directed=True, indices=self._w, return_predecessors=True)
        return self._routed(pairs, pred, y)

    def _arcs(self, path: list[int]) -> np.ndarray:
        p = np.asarray(path, dtype=np.int64)
        a, b = p[:-1], p[1:]
        k = self._edge_ids(a, b)
        return 2 * k + (a > b)


def _path(pred_row: np.ndarray, src: int, dst: int) -> list[int]:
    """Node path src -> dst from a Dijkstra predecessor row whose source is ``src``."""
    out = [dst]
    cur = dst
    while cur != src:
        cur = int(pred_row[cur])
        if cur < 0:
            raise RuntimeError(f"no path {src}->{dst}")
        out.append(cur)
    return out[::-1]


def make_oracle(g: CapGraph) -> Oracle:
    """The minimum-spanning-tree oracle for capacity graph `g`."""
    return Oracle(g)
