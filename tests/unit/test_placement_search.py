"""The coarse-graph search (`placement.search`) and the warm-started MILP (`placement.improve`):
the MILP never returns worse than its start and reaches the brute-force optimum when allowed
to finish, symmetric devices are found and renaming them keeps the objective, the search keeps
the candidate its score prefers, and the same input gives the same placement twice (also
through the planner's `search: auto` and `search: milp`)."""

from __future__ import annotations

import itertools
import random

import pytest

from topoctl.placement import heft, milp, partition, search
from topoctl.placement.improve import canonical, improve, symmetric_classes
from topoctl.placement.problem import (
    Placement,
    PlacementProblem,
    evaluate,
    memory_ok,
    priority_order,
    serial,
)


def problem(n: int, speeds: list[float], seed: int, mb: int = 1, bw: float = 50.0,
            capacity: float = 1e9) -> PlacementProblem:
    rng = random.Random(seed)
    work = [rng.uniform(1, 10) for _ in range(n)]
    edges = {}
    for j in range(1, n):
        for i in range(j):
            if rng.random() < 0.4 or i == j - 1:
                edges[(i, j)] = rng.uniform(10, 200)
    dv = len(speeds)
    return PlacementProblem(
        nodes=[f"n{i}" for i in range(n)], devices=[f"d{d}" for d in range(dv)],
        cost=[[w / s for s in speeds] for w in work], memory=[1.0] * n,
        capacity=[capacity] * dv, edges=edges,
        bandwidth=[[float("inf") if d == e else bw for e in range(dv)] for d in range(dv)],
        latency=[[0.0 if d == e else 0.01 for e in range(dv)] for d in range(dv)],
        microbatches=mb)


def brute_force(p: PlacementProblem) -> float:
    """Best objective over every assignment, each scheduled in every topological order."""
    preds = p.preds()

    def orders(done: list[int], left: set[int]):
        if not left:
            yield list(done)
        for i in sorted(left):
            if all(q in done for q in preds[i]):
                yield from orders(done + [i], left - {i})

    every = list(orders([], set(range(len(p.nodes)))))
    return min(evaluate(p, list(a), o).objective
               for a in itertools.product(range(len(p.devices)), repeat=len(p.nodes))
               if memory_ok(p, list(a)) for o in every)


@pytest.mark.parametrize("seed,mb", [(0, 1), (1, 3), (2, 4)])
def test_warm_start_reaches_the_optimum_from_the_worst_start(seed, mb):
    p = problem(5, [1.0, 2.0, 0.7], seed, mb=mb)
    start = serial(p)  # everything on one device: far from optimal
    got = improve(p, start, node_limit=100000)
    assert got.objective == pytest.approx(brute_force(p), rel=1e-6)
    assert got.objective <= start.objective
    assert got.gap == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_warm_start_is_never_worse_than_heft_and_respects_memory(seed):
    p = problem(9, [1.0, 1.6, 1.0, 1.6], seed, mb=1 + seed % 4, capacity=4.0)
    start = heft.place(p)
    got = improve(p, start, node_limit=10)
    assert got.objective <= start.objective * (1 + 1e-9)
    assert memory_ok(p, got.assign)
    assert got.info["start_objective"] == start.objective
    # the reported objective is the shared yardstick's for the returned assignment
    assert got.objective == pytest.approx(min(evaluate(p, got.assign).objective,
                                              evaluate(p, got.assign, got_order(got)).objective))


def got_order(pl: Placement) -> list[int]:
    return sorted(range(len(pl.assign)), key=lambda i: (pl.start[i], i))


def test_symmetric_devices_are_found_and_renaming_keeps_the_objective():
    p = problem(8, [1.0, 2.0, 1.0, 2.0, 3.0], 3, mb=3)
    assert symmetric_classes(p) == [[0, 2], [1, 3]]
    start = heft.heft(p)
    renamed = canonical(p, start.assign, symmetric_classes(p))
    assert evaluate(p, renamed).objective == pytest.approx(evaluate(p, start.assign).objective)
    load = [sum(p.cost[i][d] for i, a in enumerate(renamed) if a == d) for d in range(5)]
    assert load[0] >= load[2] and load[1] >= load[3]
    got = improve(p, start, node_limit=50, symmetry=True)
    assert got.objective <= start.objective * (1 + 1e-9)
    assert got.info["symmetric_classes"] == [[0, 2], [1, 3]]


def test_the_upper_bound_cuts_off_worse_solutions():
    p = problem(6, [1.0, 2.0], 4, mb=2)
    start = heft.place(p)
    mo = milp.formulate(p, upper=start.objective)
    assert mo.col_ub[mo.c_col] == start.objective
    assert all(mo.col_ub[mo.s0 + i] == start.objective for i in range(len(p.nodes)))
    # the cut-off row: C + (mb - 1) L <= upper
    last = mo.a.getrow(mo.a.shape[0] - 1).toarray()[0]
    assert last[mo.c_col] == 1.0 and last[mo.l_col] == 1.0
    assert mo.row_ub[-1] == start.objective


def test_search_keeps_what_its_score_prefers():
    p = problem(9, [1.0, 1.5, 2.0], 5, mb=4)
    by_objective = search.search(p)
    objs = {k: v["objective"] for k, v in by_objective.info["candidates"].items()}
    assert by_objective.objective == min(objs.values())
    # a score that prefers one device over any split
    one = search.search(p, score=lambda a: float(len(set(a))))
    assert one.info["chosen"] == "serial" and len(set(one.assign)) == 1
    assert set(one.info["seconds"]) == {"heuristics", "milp", "scoring"}


def test_search_with_the_milp_is_never_worse_and_is_deterministic():
    p = problem(10, [1.0, 1.5, 1.0, 1.5], 6, mb=4)
    plain = search.search(p)
    a = search.search(p, milp=True, node_limit=20)
    b = search.search(p, milp=True, node_limit=20)
    assert a.objective <= plain.objective * (1 + 1e-9)
    assert a.assign == b.assign and a.objective == b.objective
    assert a.info["milp"]["nodes"] <= 20 + 1
    assert priority_order(p)  # the problem is a DAG the heuristics accept


def test_a_contiguous_split_for_every_stage_count_is_a_candidate():
    p = problem(10, [1.0, 2.0, 1.5, 0.5], 7, mb=4, capacity=6.0)
    splits = partition.by_stage_count(p)
    assert [s.algorithm for s in splits] == ["partition-2", "partition-3", "partition-4"]
    for k, s in enumerate(splits, start=2):
        assert len(set(s.assign)) <= k and memory_ok(p, s.assign)
        changes = sum(a != b for a, b in zip(s.assign, s.assign[1:], strict=False))
        assert changes == len(set(s.assign)) - 1  # contiguous: each device one run
    # two stages on the two fastest devices (speeds 2.0 and 1.5)
    assert set(splits[0].assign) <= {1, 2}
    cands, _ = search.candidates(p)
    names = {c.algorithm for c in cands}
    assert "heft" in names and "serial" not in names  # one device cannot hold the model
    assert names & {"partition-2", "partition-3", "partition-4", "partition"}
    assert len({tuple(c.assign) for c in cands}) == len(cands)  # each assignment once
