"""Placement algorithms on small problems: the MILP is optimal (brute force over every
assignment and every processing order), the heuristic sits between the lower bound and the
baselines, memory limits hold, and impossible memory is a clear PlacementError (a TopoError)."""

from __future__ import annotations

import itertools
import random

import pytest

from topoagent.protocol import TopoError
from topoctl.placement import heft, milp, partition
from topoctl.placement.problem import (
    PlacementError,
    PlacementProblem,
    evaluate,
    lower_bound,
    memory_ok,
    serial,
)


def problem(n: int, speeds: list[float], seed: int, bw: float = 50.0, mb: int = 1,
            capacity: float = 1e9, memory: float = 1.0, p_edge: float = 0.4
            ) -> PlacementProblem:
    rng = random.Random(seed)
    work = [rng.uniform(1, 10) for _ in range(n)]
    edges = {}
    for j in range(1, n):
        for i in range(j):
            if rng.random() < p_edge or (i == j - 1 and not any(k[1] == j for k in edges)):
                edges[(i, j)] = rng.uniform(10, 200)
    dv = len(speeds)
    bwm = [[float("inf") if d == e else bw * (1 + (d + e) % 2) for e in range(dv)]
           for d in range(dv)]
    return PlacementProblem(nodes=[f"n{i}" for i in range(n)], devices=[f"d{d}" for d in range(dv)],
                            cost=[[w / s for s in speeds] for w in work], memory=[memory] * n,
                            capacity=[capacity] * dv, edges=edges, bandwidth=bwm,
                            latency=[[0.0 if d == e else 0.01 for e in range(dv)]
                                     for d in range(dv)], microbatches=mb)


def topo_orders(p: PlacementProblem):
    preds = p.preds()
    n = len(p.nodes)

    def rec(done: list[int], left: set[int]):
        if not left:
            yield list(done)
            return
        for i in sorted(left):
            if all(q in done for q in preds[i]):
                done.append(i)
                yield from rec(done, left - {i})
                done.pop()

    yield from rec([], set(range(n)))


def brute_force(p: PlacementProblem) -> float:
    orders = list(topo_orders(p))
    best = float("inf")
    for assign in itertools.product(range(len(p.devices)), repeat=len(p.nodes)):
        if not memory_ok(p, list(assign)):
            continue
        for o in orders:
            best = min(best, evaluate(p, list(assign), o).objective)
    return best


@pytest.mark.parametrize("seed,mb", [(0, 1), (1, 1), (2, 1), (3, 3), (4, 4)])
def test_milp_is_optimal_on_tiny_instances(seed, mb):
    p = problem(5, [1.0, 2.0, 0.7], seed, mb=mb)
    opt = brute_force(p)
    got = milp.place(p, node_limit=100000)
    assert got.gap == pytest.approx(0.0, abs=1e-6)
    assert got.objective == pytest.approx(opt, rel=1e-6)
    assert got.info["milp_objective"] == pytest.approx(opt, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_heuristic_between_the_lower_bound_and_the_baselines(seed):
    p = problem(12, [1.0, 1.5, 0.5, 2.0], seed, mb=1 + seed % 3)
    h = heft.place(p)
    lb = lower_bound(p)
    assert lb <= h.objective * (1 + 1e-9)
    assert h.objective <= partition.place(p).objective + 1e-9
    assert h.objective <= serial(p).objective + 1e-9
    # and on the exact side: never better than the MILP's proven optimum
    m = milp.place(p, node_limit=5000)
    if m.gap == 0.0:
        assert m.objective <= h.objective * (1 + 1e-6)


@pytest.mark.parametrize("algo", ["milp", "heft", "partition"])
def test_memory_limits_are_respected(algo):
    # each device holds 3 of the 8 unit-memory nodes: at least three devices must be used
    p = problem(8, [1.0, 4.0, 1.0, 1.0], 7, capacity=3.0, bw=1e6)
    fn = {"milp": lambda q: milp.place(q, node_limit=3000), "heft": heft.heft,
          "partition": partition.place}[algo]
    got = fn(p)
    assert memory_ok(p, got.assign)
    assert len(got.devices_used()) >= 3
    # without the limit everything would crowd onto the fast device
    free = problem(8, [1.0, 4.0, 1.0, 1.0], 7, bw=1e6)
    assert max(map(fn(free).assign.count, range(4))) > 3


@pytest.mark.parametrize("algo", ["milp", "heft", "partition"])
def test_a_model_that_fits_nowhere_is_a_clear_error(algo):
    p = problem(4, [1.0, 1.0], 1, capacity=1.5, memory=1.0)  # 4 units, 3 available
    fn = {"milp": milp.place, "heft": heft.place, "partition": partition.place}[algo]
    with pytest.raises(PlacementError) as e:
        fn(p)
    assert isinstance(e.value, TopoError)
    assert "GB" in str(e.value) or "memory" in str(e.value)
    big = problem(3, [1.0, 1.0], 1, capacity=1.0, memory=2.0)  # one node bigger than any device
    with pytest.raises(PlacementError, match="more than any device"):
        fn(big)


def test_milp_node_limit_is_deterministic_and_reports_a_gap():
    p = problem(14, [1.0, 1.3, 0.6, 2.0], 11, mb=2)
    a = milp.place(p, node_limit=1)
    b = milp.place(p, node_limit=1)
    assert a.assign == b.assign and a.objective == b.objective
    assert a.gap is not None and a.gap >= 0
    assert a.info["nodes"] >= 0 and not a.info["time_limited"]
