"""The tree AllReduce runtime's rules that the planner's cost model counts by: how many chunks
a tensor is cut into, which step each rank of a tree reduces and broadcasts in, and how many
steps ahead receives are posted. The runtime (`topotrain.collectives.program`) executes them;
the controller (`topoctl.collective.trees`) predicts with them. Import-light: no torch."""

from __future__ import annotations

import math
from collections.abc import Sequence

from topocontract.schedule import TreeSchedule, partition_sizes

LOOKAHEAD = 4
"""Steps whose receives are posted ahead of the step being run (see :func:`run_program`)."""


def chunk_count(schedule: TreeSchedule, numel: int, element_size: int) -> int:
    """Chunks per tree: ``ceil(largest partition bytes / chunk_bytes)`` over the trees (a tree's
    own ``chunk_bytes`` overrides the schedule's), at least 1. Every tree uses this count, so
    a chunk of any tree takes about the same time at that tree's rate."""
    sizes = partition_sizes(numel, schedule.fractions)
    c = 1
    for tree, n in zip(schedule.trees, sizes, strict=True):
        cb = tree.chunk_bytes or schedule.chunk_bytes
        c = max(c, math.ceil(n * element_size / cb))
    return c


def up_depth(parents: Sequence[int | None]) -> tuple[list[int], list[int]]:
    """Per rank of one tree given by `parents` (None at the root): its height above its deepest
    leaf (`up`) and its distance from the root (`depth`). The lock-step program reduces
    ``r -> parent`` at step ``k + up[r]`` and broadcasts down by depth; the planner's cost
    model counts steps by the same rule."""
    n = len(parents)
    depth = [0] * n
    for r in range(n):
        d, cur = 0, r
        while parents[cur] is not None:
            cur, d = parents[cur], d + 1
        depth[r] = d
    up = [0] * n
    for r in sorted(range(n), key=lambda x: -depth[x]):
        p = parents[r]
        if p is not None:
            up[p] = max(up[p], up[r] + 1)
    return up, depth
