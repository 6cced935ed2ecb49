"""Baseline: a balanced contiguous partition of the node order into pipeline stages.

The nodes' topological order is cut into at most D consecutive segments, segment s on device
`order[s]`; a dynamic program over (prefix, stages) minimises the bottleneck stage time, where
a stage costs max(its compute on its device, the time to send the bytes crossing its end to
the next stage's device), and respects every device's memory (PipeDream's partitioner,
Narayanan et al., SOSP'19, restricted to one replica per stage; METIS-style balance on a path).
The DP is exact for contiguous partitions with that cost; the result is then scored with the
shared objective (`problem.evaluate`). O(D * n^2) time, O(D * n) memory.
"""

from __future__ import annotations

import math

from topoctl.placement.problem import Placement, PlacementError, PlacementProblem, evaluate


def cut_bytes(p: PlacementProblem) -> list[float]:
    """cut[k] = bytes on edges (i, j) with i < k <= j: what crosses a boundary before node k."""
    n = len(p.nodes)
    delta = [0.0] * (n + 1)
    for (i, j), b in p.edges.items():
        delta[i + 1] += b
        delta[j + 1] -= b
    out, run = [0.0] * (n + 1), 0.0
    for k in range(n + 1):
        run += delta[k]
        out[k] = run
    return out


def _table(p: PlacementProblem, order: list[int]
           ) -> tuple[list[list[float]], list[list[int]]]:
    """The DP: best[s][k], the min bottleneck of nodes [0, k) in stages 0..s on order[0..s],
    and back[s][k], where stage s starts."""
    n, dv = len(p.nodes), len(p.devices)
    pre_cost = [[0.0] * (n + 1) for _ in range(dv)]
    for d in range(dv):
        for i in range(n):
            pre_cost[d][i + 1] = pre_cost[d][i] + p.cost[i][d]
    pre_mem = [0.0] * (n + 1)
    for i in range(n):
        pre_mem[i + 1] = pre_mem[i] + p.memory[i]
    cut = cut_bytes(p)
    best = [[math.inf] * (n + 1) for _ in range(len(order))]
    back = [[-1] * (n + 1) for _ in range(len(order))]
    for s, d in enumerate(order):
        nxt = order[s + 1] if s + 1 < len(order) else None
        for k in range(1, n + 1):
            out = p.comm(cut[k], d, nxt) if nxt is not None and k < n else 0.0
            for j in range(0 if s == 0 else 1, k):
                prev = 0.0 if s == 0 else best[s - 1][j]
                if s == 0 and j > 0:
                    break
                if prev == math.inf or pre_mem[k] - pre_mem[j] > p.capacity[d]:
                    continue
                v = max(prev, pre_cost[d][k] - pre_cost[d][j], out)
                if v < best[s][k]:
                    best[s][k], back[s][k] = v, j
    return best, back


def _assign(p: PlacementProblem, order: list[int], back: list[list[int]], stages: int
            ) -> list[int]:
    assign = [0] * len(p.nodes)
    k = len(p.nodes)
    for s in range(stages, -1, -1):
        j = back[s][k]
        for i in range(j, k):
            assign[i] = order[s]
        k = j
    return assign


def place(p: PlacementProblem, order: list[int] | None = None) -> Placement:
    """Best contiguous partition over devices in `order` (default: the problem's order);
    PlacementError when no contiguous split fits in memory."""
    p.check()
    n, dv = len(p.nodes), len(p.devices)
    order = list(range(dv)) if order is None else order
    best, back = _table(p, order)
    stages = min(range(len(order)), key=lambda s: (best[s][n], s))
    if best[stages][n] == math.inf:
        raise PlacementError(f"no contiguous split of the model into at most {dv} stages fits "
                             "the devices' memory")
    return evaluate(p, _assign(p, order, back, stages), algorithm="partition")


def place_exactly(p: PlacementProblem, stages: int) -> Placement:
    """The balanced contiguous partition into exactly `stages` stages on the problem's first
    `stages` devices in their order (a pipeline shape fixed by the caller, e.g. stages of
    unequal replica counts); PlacementError when none fits. Same DP, O(D * n^2)."""
    p.check()
    n = len(p.nodes)
    order = list(range(stages))
    best, back = _table(p, order)
    if stages > n or best[stages - 1][n] == math.inf:
        raise PlacementError(f"no contiguous split of the model into {stages} stages fits the "
                             "devices' memory")
    return evaluate(p, _assign(p, order, back, stages - 1), algorithm=f"partition-{stages}")


def by_stage_count(p: PlacementProblem) -> list[Placement]:
    """For every stage count from 2 to D, the balanced contiguous partition into that many
    stages on the fastest devices (by their total cost; ties by index), each that fits the
    memory: fewer stages send fewer messages, which the bottleneck rule of `place` does not
    see (the simulator does). Algorithm names `partition-k`. Same DP, O(D * n^2)."""
    p.check()
    n, dv = len(p.nodes), len(p.devices)
    order = sorted(range(dv), key=lambda d: (sum(c[d] for c in p.cost), d))
    best, back = _table(p, order)
    return [evaluate(p, _assign(p, order, back, s), algorithm=f"partition-{s + 1}")
            for s in range(1, dv) if best[s][n] < math.inf]
