"""The coarse-graph search: the heuristics' candidates, scored by the simulator, optionally
improved by the MILP started from the best of them (`parallelism.search`).

Candidates: HEFT (`heft.heft`), the balanced contiguous partition (`partition.place`), the
best single device (`problem.serial`), and the balanced contiguous partition into each stage
count from 2 to D on the fastest devices (`partition.by_stage_count`: fewer stages, fewer
messages); each assignment once. The shared objective (first micro-batch's makespan
+ (microbatches - 1) x bottleneck load) assumes later micro-batches pipeline perfectly; a
placement that sends work back and forth between devices does not (on the bench's models
HEFT's objective was 36 % below its simulated time on VGG-16 x 8, the partition's 7 %), so
every candidate is scored by `score` (the caller's simulator: seconds for an assignment) and
the fastest kept; ties by objective, then algorithm name. Without `score`, the objective.

`milp=True` adds the MILP (`improve.improve`: HiGHS, warm start from the candidate with the
best objective, upper bound and cut-off from it, deterministic node limit) as one more
candidate. Times of each part are in `info["seconds"]`.
O(n * D + E + D * n^2) for the heuristics, plus one simulation per candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from topoctl.placement import heft, partition
from topoctl.placement.improve import improve
from topoctl.placement.problem import Placement, PlacementProblem

Score = Callable[[list[int]], float]


def candidates(p: PlacementProblem, milp: bool = False, node_limit: int = 10,
               time_limit: float = 600.0) -> tuple[list[Placement], dict]:
    """The candidates (module docstring), by objective (ties: algorithm name), each assignment
    once; and info: the MILP's report and the seconds of the heuristics and of the MILP.
    PlacementError when none fits the devices' memory."""
    t0 = time.perf_counter()
    cands = heft.candidates(p)
    cands += partition.by_stage_count(p)
    t1 = time.perf_counter()
    milp_info: dict = {}
    if milp:
        start = min(cands, key=lambda c: (c.objective, c.algorithm))
        m = improve(p, start, node_limit=node_limit, time_limit=time_limit)
        milp_info = m.info
        if m.algorithm == "milp":
            cands.append(m)
    t2 = time.perf_counter()
    seen: set[tuple[int, ...]] = set()
    out = []
    for c in sorted(cands, key=lambda c: (c.objective, c.algorithm)):
        if tuple(c.assign) not in seen:
            seen.add(tuple(c.assign))
            out.append(c)
    return out, {"milp": milp_info, "seconds": {"heuristics": t1 - t0, "milp": t2 - t1}}


def search(p: PlacementProblem, score: Score | None = None, milp: bool = False,
           node_limit: int = 10, time_limit: float = 600.0) -> Placement:
    """The best candidate (module docstring). `info`: every candidate's objective and score,
    the chosen algorithm, seconds spent in the heuristics, the MILP and the scoring.
    PlacementError when no candidate fits the devices' memory. `time_limit`: the MILP's outer
    safety limit (the node limit decides the answer)."""
    cands, info = candidates(p, milp, node_limit, time_limit)
    t2 = time.perf_counter()
    scored = [(score(c.assign) if score else c.objective, c.objective, c.algorithm, c)
              for c in cands]
    best = min(scored, key=lambda s: s[:3])
    info["seconds"]["scoring"] = time.perf_counter() - t2
    info |= {"candidates": {s[2]: {"objective": s[1], "score": s[0]} for s in scored},
             "chosen": best[2]}
    c = best[3]
    return Placement(c.assign, c.objective, c.makespan, c.bottleneck, c.start, c.algorithm,
                     c.gap, info)
