"""Edge-disjoint spanning trees by matroid-union augmenting paths (an integral packing).

Edmonds' matroid partition algorithm ("Minimum partition of a matroid into independent
subsets", J. Res. NBS 1965; Knuth, "Matroid partitioning", 1973) specialised to graphic
matroids as in Roskind and Tarjan, "A note on finding minimum-cost edge-disjoint spanning
trees" (Math. Oper. Res. 1985): ``k`` forests are grown edge-disjointly; an edge that closes a
cycle in every forest is inserted along a shortest augmenting path (breadth-first search over
edges: an edge may enter forest ``i`` if it joins two of its components, or else displace any
edge on the cycle it closes in ``i``, which then has to be re-inserted elsewhere).

Bound reached: the union of the forests is a maximum-size union of ``k`` forests (a base of the
``k``-fold union of the graphic matroid), so whenever the graph has ``k`` edge-disjoint
spanning trees (Nash-Williams/Tutte: ``|delta(P)| >= k (|P| - 1)`` for every partition ``P``)
all ``k`` forests are spanning trees. On a fabric with uniform capacity ``c`` they carry
``k c`` each at rate ``c``, i.e. ``floor(tau / c) c`` against the partition bound ``tau``.

Complexity: a randomised greedy pass (union-find, ``O(k m alpha(n))``) places most edges; each
remaining edge costs one search, ``O(m k h)`` with ``h`` the forests' depth, plus ``O(k n)`` to
re-root the forests an augmentation touched; ``O(m^2 k h)`` in the worst case, far less in
practice (most edges are placed greedily). Pure Python over plain lists; no I/O.
"""

from __future__ import annotations

import random
from collections import deque

from topoctl.limits import SafetyClock

__all__ = ["disjoint_spanning_trees"]


class _Forests:
    """``k`` edge-disjoint forests over ``n`` nodes, each rooted for path queries."""

    def __init__(self, n: int, ends: list[tuple[int, int]], k: int):
        self.n, self.ends, self.k = n, ends, k
        self.owner = [-1] * len(ends)
        self.adj: list[list[set[int]]] = [[set() for _ in range(n)] for _ in range(k)]
        self.comp = [list(range(n)) for _ in range(k)]
        self.par_edge = [[-1] * n for _ in range(k)]
        self.depth = [[0] * n for _ in range(k)]
        self.size = [0] * k

    def put(self, e: int, i: int) -> None:
        old = self.owner[e]
        a, b = self.ends[e]
        if old >= 0:
            self.adj[old][a].discard(e)
            self.adj[old][b].discard(e)
            self.size[old] -= 1
        self.adj[i][a].add(e)
        self.adj[i][b].add(e)
        self.size[i] += 1
        self.owner[e] = i

    def reroot(self, i: int) -> None:
        """Recompute components, parent edges and depths of forest ``i`` (O(n))."""
        adj, ends = self.adj[i], self.ends
        comp = [-1] * self.n
        par = [-1] * self.n
        dep = [0] * self.n
        for s in range(self.n):
            if comp[s] >= 0:
                continue
            comp[s] = s
            stack = [s]
            while stack:
                x = stack.pop()
                for e in adj[x]:
                    if e == par[x]:
                        continue
                    a, b = ends[e]
                    y = b if a == x else a
                    if comp[y] >= 0:
                        raise RuntimeError(f"forest {i} has a cycle through edge {e}")
                    comp[y], par[y], dep[y] = s, e, dep[x] + 1
                    stack.append(y)
        self.comp[i], self.par_edge[i], self.depth[i] = comp, par, dep

    def path(self, i: int, a: int, b: int) -> list[int]:
        """Edges of the path a - b in forest ``i`` (same component)."""
        par, dep, ends = self.par_edge[i], self.depth[i], self.ends
        out: list[int] = []
        while a != b:
            if dep[a] >= dep[b]:
                e = par[a]
                x, y = ends[e]
                a = y if x == a else x
            else:
                e = par[b]
                x, y = ends[e]
                b = y if x == b else x
            out.append(e)
        return out

    def augment(self, e0: int) -> bool:
        """Insert unassigned edge ``e0`` along a shortest augmenting path, if one exists."""
        label: dict[int, tuple[int, int] | None] = {e0: None}
        queue = deque([e0])
        k, ends, owner, comp = self.k, self.ends, self.owner, self.comp
        while queue:
            e = queue.popleft()
            a, b = ends[e]
            for i in range(k):
                if i == owner[e]:
                    continue
                if comp[i][a] != comp[i][b]:
                    touched = set()
                    cur, target = e, i
                    while True:
                        if owner[cur] >= 0:
                            touched.add(owner[cur])
                        touched.add(target)
                        step = label[cur]
                        self.put(cur, target)
                        if step is None:
                            break
                        cur, target = step
                    for j in touched:
                        self.reroot(j)
                    return True
                for f in self.path(i, a, b):
                    if f not in label:
                        label[f] = (e, i)
                        queue.append(f)
        return False


def disjoint_spanning_trees(
    n: int,
    edges: list[tuple[int, int]],
    k: int,
    seed: int = 0,
    clock: SafetyClock | None = None,
) -> list[list[int]]:
    """``k`` pairwise edge-disjoint forests of maximum total size over nodes ``0..n-1``.

    ``edges`` are ``(u, v)`` pairs (parallel edges allowed, loops ignored). Returns ``k`` lists
    of edge indices; a list with ``n - 1`` edges is a spanning tree (all ``k`` are when the
    graph has ``k`` edge-disjoint spanning trees). Deterministic for a given ``seed``: at most one
    augmentation per edge left over by the greedy pass; the wall-clock safety ``clock`` can only
    cut it short (recorded in it). Spanning forests come first.
    """
    if k < 1 or n < 1:
        return []
    ends = [(int(a), int(b)) for a, b in edges]
    fs = _Forests(n, ends, k)
    # greedy: random order, each edge into the first forest it does not close a cycle in
    order = [e for e in range(len(ends)) if ends[e][0] != ends[e][1]]
    random.Random(seed).shuffle(order)
    uf = [list(range(n)) for _ in range(k)]

    def find(p: list[int], x: int) -> int:
        while p[x] != x:
            p[x] = p[p[x]]
            x = p[x]
        return x

    left: list[int] = []
    for e in order:
        a, b = ends[e]
        for i in range(k):
            ra, rb = find(uf[i], a), find(uf[i], b)
            if ra != rb:
                uf[i][ra] = rb
                fs.put(e, i)
                break
        else:
            left.append(e)
    for i in range(k):
        fs.reroot(i)
    full = k * (n - 1)
    for e in left:
        if sum(fs.size) >= full:
            break
        if clock is not None and clock.expired("disjoint_spanning_trees"):
            break
        fs.augment(e)
    out = [[] for _ in range(k)]
    for e, i in enumerate(fs.owner):
        if i >= 0:
            out[i].append(e)
    return sorted(out, key=len, reverse=True)
