"""Tree schedules as simulator collectives (``topoctl.sim.collectives.Schedule``).

Each tree's partition is cut into chunks; the reduce step of chunk ``k`` on arc
``child -> parent`` waits for chunk ``k`` from all of the child's children and for chunk
``k - 1`` on the same arc (FIFO); the broadcast step ``parent -> child`` waits for chunk ``k``
to have reached the parent (at the root: all of its children's reduce steps) and for chunk
``k - 1`` on the same arc. All trees run at once, sharing links max-min fairly in the engine:
the same model the simulator uses for rings. O(trees * chunks * N) steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from topoagent.collectives.schedule import TreeSchedule, partition_sizes
from topoctl.fabric.capgraph import CapGraph
from topoctl.sim.collectives import CollectiveAlgorithm, Schedule, Step
from topoctl.sim.network import Link, Network

from .pack import TreePlan

__all__ = ["network_from_capgraph", "tree_algorithm", "tree_allreduce_schedule"]


def _depths(parents: Sequence[int | None]) -> list[int]:
    out = []
    for r in range(len(parents)):
        d, cur = 0, r
        while parents[cur] is not None:
            cur, d = parents[cur], d + 1
        out.append(d)
    return out


def tree_allreduce_schedule(
    members: Sequence[str], size: float, schedule: TreeSchedule, max_chunks: int = 16
) -> Schedule:
    """AllReduce of ``size`` bytes over ``members`` (rank r = members[r]) with ``schedule``."""
    if len(members) != schedule.world_size:
        raise ValueError(
            f"tree schedule is for {schedule.world_size} ranks, got {len(members)} members"
        )
    steps: list[Step] = []
    units = max(1, int(round(size)))
    parts = partition_sizes(units, schedule.fractions)
    for tree, part in zip(schedule.trees, parts, strict=True):
        nbytes = part * size / units
        if nbytes <= 0:
            continue
        cb = tree.chunk_bytes or schedule.chunk_bytes
        nch = max(1, min(max_chunks, math.ceil(nbytes / cb)))
        chunk = nbytes / nch
        par = tree.parents
        depth = _depths(par)
        up = sorted((r for r in range(len(par)) if par[r] is not None), key=lambda r: -depth[r])
        down = sorted((r for r in range(len(par)) if par[r] is not None), key=lambda r: depth[r])
        kids: dict[int, list[int]] = {}
        for r in up:
            kids.setdefault(par[r], []).append(r)
        red_prev: dict[int, int] = {}
        bc_prev: dict[int, int] = {}
        for _ in range(nch):
            red: dict[int, int] = {}  # rank -> index of its reduce step (rank -> parent)
            for r in up:
                deps = [red[c] for c in kids.get(r, [])]
                if r in red_prev:
                    deps.append(red_prev[r])
                red[r] = len(steps)
                steps.append(Step(members[r], members[par[r]], chunk, tuple(deps)))
            bc: dict[int, int] = {}  # rank -> index of the step that brought chunk k to it
            for r in down:
                p = par[r]
                deps = [bc[p]] if p in bc else [red[c] for c in kids.get(p, [])]
                if r in bc_prev:
                    deps.append(bc_prev[r])
                bc[r] = len(steps)
                steps.append(Step(members[p], members[r], chunk, tuple(deps)))
            red_prev, bc_prev = red, bc
    return Schedule("tree-allreduce", tuple(members), tuple(steps))


def tree_algorithm(schedule: TreeSchedule, max_chunks: int = 16) -> CollectiveAlgorithm:
    """A ``CollectiveAlgorithm`` (members, size) -> Schedule bound to ``schedule``."""

    def algo(members: Sequence[str], size: float) -> Schedule:
        return tree_allreduce_schedule(members, size, schedule, max_chunks)

    return algo


def network_from_capgraph(
    g: CapGraph,
    bytes_per_unit: float,
    latency: float = 0.0,
    plan: TreePlan | None = None,
) -> Network:
    """A simulator network of ``g`` (each link two arcs of ``cap * bytes_per_unit`` bytes/s).

    Routes: a direct link if there is one; else the plan's routed paths for that worker pair
    (weighted by tree rate); else fewest hops."""
    links: dict[str, Link] = {}
    adj: dict[str, list[str]] = {}
    for a, b, c in zip(g.u.tolist(), g.v.tolist(), g.cap.tolist(), strict=True):
        na, nb = str(g.nodes[a]), str(g.nodes[b])
        for s, d in ((na, nb), (nb, na)):
            links[f"{s}>{d}"] = Link(f"{s}>{d}", s, d, c * bytes_per_unit, latency)
            adj.setdefault(s, []).append(d)
    table: dict[tuple[str, str], dict[tuple[str, ...], float]] = {}
    if plan is not None:
        label = [str(g.nodes[w]) for w in g.workers]
        for t in plan.trees:
            for (a, b), (pab, pba) in t.paths.items():
                for x, y, p in ((a, b, pab), (b, a, pba)):
                    ids = tuple(
                        f"{g.nodes[i]}>{g.nodes[j]}" for i, j in zip(p[:-1], p[1:], strict=True)
                    )
                    key = (label[x], label[y])
                    table.setdefault(key, {})
                    table[key][ids] = table[key].get(ids, 0.0) + t.rate

    def route(src: str, dst: str):
        if f"{src}>{dst}" in links:
            return [(1.0, (f"{src}>{dst}",))]
        if (src, dst) in table:
            return [(w, p) for p, w in table[(src, dst)].items()]
        prev = {src: ""}
        queue = [src]
        for x in queue:
            for y in adj.get(x, []):
                if y not in prev:
                    prev[y] = x
                    queue.append(y)
        if dst not in prev:
            return []
        path = []
        cur = dst
        while cur != src:
            path.append(f"{prev[cur]}>{cur}")
            cur = prev[cur]
        return [(1.0, tuple(reversed(path)))]

    return Network(links, route)
