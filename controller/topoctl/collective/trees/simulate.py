"""Tree schedules as simulator collectives (``topoctl.sim.schedules.Schedule``).

Each tree's partition is cut into the runtime's chunk count (the same on every tree,
``topotrain.collectives.program.chunk_count``; at most ``max_chunks`` here); the reduce step
of chunk ``k`` on arc ``child -> parent`` waits for chunk ``k`` from all of the child's
children and for chunk ``k - 1`` on the same arc (FIFO); the broadcast step
``parent -> child`` waits for chunk ``k`` to have reached the parent (at the root: all of its
children's reduce steps) and for chunk ``k - 1`` on the same arc. All trees run at once,
sharing links max-min fairly in the engine: the same model the simulator uses for rings.
O(trees * chunks * N) steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from topocontract.schedule import TreeSchedule, partition_sizes
from topocontract.trees import chunk_count
from topoctl.sim.schedules import CollectiveAlgorithm, Schedule, Step

__all__ = ["tree_algorithm", "tree_allreduce_schedule"]


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
    chunks = chunk_count(schedule, units, 1)  # the runtime's: the same count on every tree
    for tree, part in zip(schedule.trees, parts, strict=True):
        nbytes = part * size / units
        if nbytes <= 0:
            continue
        nch = max(1, min(max_chunks, chunks, part))
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
