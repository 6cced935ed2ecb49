"""DisCo's algorithm (`topoctl.disco`: timeline, anchors, search, autotune) on plain data, and
the `disco` strategy on a roofline plan: the bucket plan names every parameter once in
gradient-ready order, the result is never slower than an anchor, the plan is the same bytes
for the same input."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import yaml

from topoagent.state.wire import plan_problems
from topocontract.fusion import parse_fusion
from topoctl.catalog.transformer import BertEncoder
from topoctl.disco.autotune import autotune_cap
from topoctl.disco.search import Candidate, best_first, neighbours
from topoctl.disco.timeline import (
    cap_partition,
    comm_end,
    mgwfbp_partition,
    optimal_partition,
    ready_times,
)
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.baseline import buckets

PLANS = Path(__file__).resolve().parents[2] / "plans"


def _instance(n: int, seed: int) -> tuple[list[float], list[int]]:
    rng = random.Random(seed)
    ready, _ = ready_times([rng.uniform(0.1, 2.0) for _ in range(n)], [True] * n)
    return ready, [rng.randrange(1, 100) for _ in range(n)]


def _all_partitions(n: int):
    for mask in itertools.product((0, 1), repeat=n - 1):
        yield tuple(i for i in range(n - 1) if mask[i]) + (n - 1,)


@pytest.mark.parametrize("seed", range(6))
def test_the_optimum_is_the_best_of_every_partition(seed):
    ready, size = _instance(8, seed)
    a, b = (0.5, 0.01) if seed % 2 else (0.05, 0.03)
    brute = min(comm_end(ready, size, p, a, b) for p in _all_partitions(8))
    assert comm_end(ready, size, optimal_partition(ready, size, a, b), a, b) == \
        pytest.approx(brute)
    # MG-WFBP is an anchor, never better than the optimum
    assert comm_end(ready, size, mgwfbp_partition(ready, size, a, b), a, b) >= brute - 1e-12


def test_mgwfbp_merges_only_when_the_start_up_pays():
    ready, size = [1.0, 2.0, 3.0], [10, 10, 10]
    assert mgwfbp_partition(ready, size, 0.0, 0.01) == (0, 1, 2)  # no start-up: no merge
    assert mgwfbp_partition(ready, size, 5.0, 0.01) == (2,)  # start-up dwarfs the wait


def test_cap_partition_is_ddps_rule():
    size = [30, 30, 50, 10, 10, 40]
    assert cap_partition(size, 60) == (1, 3, 5)
    assert cap_partition(size, 60, first_cap=20) == (0, 2, 5)  # DDP's small first bucket
    assert cap_partition(size, 10**9) == (5,)


def test_search_finds_the_optimum_deterministically_and_keeps_its_budget():
    ready, size = _instance(10, 7)
    cost = lambda c: comm_end(ready, size, c.cuts, 0.3, 0.02)  # noqa: E731
    start = [Candidate("none", (9,)), Candidate("none", tuple(range(10)))]
    runs = [best_first(start, 10, ["none"], cost, seed=3, budget=400) for _ in range(2)]
    assert runs[0].best == runs[1].best and runs[0].trace == runs[1].trace
    best = min(comm_end(ready, size, p, 0.3, 0.02) for p in _all_partitions(10))
    assert runs[0].cost == pytest.approx(best)
    assert runs[0].evaluations <= 400
    assert all(t <= 1.1 * runs[0].cost for t, _ in runs[0].kept)


def test_search_chooses_the_fusion_option_that_pays():
    # option "fused" makes every gradient ready earlier: the search switches to it
    ready, size = _instance(6, 1)
    fast = [r * 0.5 for r in ready]
    cost = lambda c: comm_end(fast if c.fusion == "fused" else ready,  # noqa: E731
                              size, c.cuts, 0.2, 0.01)
    res = best_first([Candidate("none", (5,))], 6, ["fused", "none"], cost, budget=200)
    assert res.best.fusion == "fused"


def test_neighbours_are_legal_partitions():
    rng = random.Random(0)
    c = Candidate("none", (2, 5, 9))
    for _ in range(50):
        for m in neighbours(c, 10, ["none", "x"], rng, 4):
            assert m.cuts[-1] == 9 and list(m.cuts) == sorted(set(m.cuts))
            assert all(0 <= k <= 9 for k in m.cuts) and m != c


def test_autotune_finds_the_bottom_of_a_valley():
    cap, t, sampled = autotune_cap(lambda c: abs(c.bit_length() - 24) + 1.0)
    assert 2**22 <= cap <= 2**26 and t <= 2.0 and len(sampled) <= 12


JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "disco",
       "model": {"catalog": "mlp", "params": {"layers": 4, "hidden": 1024}},
       "batch": {"global": 512}, "sync": {"bucket": "4MB"}, "cost": {"method": "roofline"},
       "strategies": ["baseline", "disco"]}


def test_the_strategy_plans_named_buckets_no_slower_than_the_anchors():
    cluster = load_cluster(PLANS / "fast4-cluster.yaml")
    doc, ctx, evals = make_plan(cluster, parse_job(JOB), use_cache=False)
    by_name = {e.strategy.name: e for e in evals}
    disco = by_name["baseline+disco"]
    notes = disco.strategy.notes["disco"]
    assert disco.result.iteration_time <= min(notes["anchors"].values()) + 1e-9
    plan = disco.strategy.collective["bucket_plan"]
    named = [p for b in plan for p in b["params"]]
    assert named == [p for _, p, _ in ctx.graph.gradient_order()]
    assert [b["bytes"] for b in plan] == disco.strategy.buckets
    # the job's cap anchor is the baseline's bucketing, simulated the same way
    assert notes["anchors"]["job-cap"] == pytest.approx(
        by_name["baseline"].result.iteration_time, rel=1e-5)
    assert sum(disco.strategy.buckets) == sum(s for _, s in buckets(ctx.graph, 4 << 20))
    assert doc["metadata"]["strategy"] == "baseline+disco" and plan_problems(doc) == []
    assert doc["job"]["collective"]["bucket_plan"] == plan
    again, _, _ = make_plan(cluster, parse_job(JOB), use_cache=False)
    assert yaml.safe_dump(again) == yaml.safe_dump(doc)  # the same bytes


def test_a_fusion_that_pays_is_planned_as_regions_the_runtime_compiles():
    """A transformer on modelled GPUs (roofline: a fused encoder layer saves launches and the
    memory traffic of its inner tensors): the strategy picks a fusion option with the buckets,
    and the plan carries its regions as ``job.fusion``, module paths the runtime compiles."""
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "fuse",
                     "model": {"catalog": "bert", "params": {"layers": 4, "hidden": 256,
                                                            "heads": 4, "seq": 64,
                                                            "vocab": 1000}},
                     "batch": {"global": 64}, "strategies": ["disco"],
                     "cost": {"method": "roofline", "device": "A100"}})
    doc, ctx, (ev,) = make_plan(load_cluster(PLANS / "fast4-cluster.yaml"), job,
                                use_cache=False)
    chosen = ev.strategy.notes["disco"]["fusion"]
    assert chosen != "none"
    fusion = parse_fusion(doc["job"]["fusion"])
    assert fusion.mode == chosen and fusion.regions
    modules = dict(BertEncoder(layers=4, hidden=256, heads=4, seq=64, vocab=1000)
                   .named_modules())
    assert set(fusion.regions) <= set(modules)
    assert plan_problems(doc) == []
