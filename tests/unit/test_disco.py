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
from topocontract.slicing import slicing_of
from topoctl.catalog.transformer import BertEncoder
from topoctl.disco.autotune import autotune_cap
from topoctl.disco.priority import cut
from topoctl.disco.search import Candidate, best_first, issue_order, neighbours
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


def test_the_search_spends_its_budget_when_the_queue_runs_dry():
    """Issue 35: on ResNet-18 the queue emptied after 32 of 300 simulations (one expansion,
    three of its four moves back to initial candidates, the fourth out of the window). Here
    only the two-bucket partitions of 12 units are within the window and the search starts
    from one of them: the moves lead to new candidates, and when the queue runs dry the kept
    candidates are expanded again until every one of the 11 is found and nothing new is
    left around them (1 + 11 + 55 three-bucket partitions: all there is), well within the
    budget; the same for the same seed."""
    cost = lambda c: 1.0 if len(c.cuts) == 2 else 2.0  # noqa: E731
    start = [Candidate("none", (11,)), Candidate("none", (5, 11))]
    runs = [best_first(start, 12, ["none"], cost, budget=300) for _ in range(2)]
    assert runs[0].kept == runs[1].kept and runs[0].trace == runs[1].trace
    assert sorted(c.cuts for _, c in runs[0].kept) == [(i, 11) for i in range(11)]
    assert runs[0].evaluations == 1 + 11 + 55 and runs[0].restarts >= 1
    # an expansion never spends a move on a candidate already scored
    rng, c = random.Random(0), Candidate("none", (3, 11))
    seen = {Candidate("none", (11,)), Candidate("none", (2, 11)), Candidate("none", (4, 11))}
    for _ in range(20):
        assert not seen & set(neighbours(c, 12, ["none"], rng, 4, exclude=seen))


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
    grad_order = [p for _, p, _ in ctx.graph.gradient_order()]
    # buckets of consecutive parameters in gradient-ready order, listed in AllReduce order
    # (forward overlap: the held-back tail in forward order, `issue_order`)
    ready = sorted(plan, key=lambda b: grad_order.index(b["params"][0]))
    assert [p for b in ready for p in b["params"]] == grad_order
    order = issue_order(len(plan), notes["tail"])
    assert [ready[k] for k in order] == plan
    assert (disco.strategy.collective.get("bucket_overlap", "backward") == notes["overlap"])
    assert [b["bytes"] for b in plan] == disco.strategy.buckets
    # the job's cap anchor is the baseline's bucketing, simulated the same way
    assert notes["anchors"]["job-cap"] == pytest.approx(
        by_name["baseline"].result.iteration_time, rel=1e-5)
    assert sum(disco.strategy.buckets) == sum(s for _, s in buckets(ctx.graph, 4 << 20))
    assert doc["metadata"]["strategy"] == "baseline+disco" and plan_problems(doc) == []
    assert doc["job"]["collective"]["bucket_plan"] == plan
    # ByteScheduler's default and the counted grid are anchors; the pick here is sliced:
    # slices all-reduced first-layer-first (an MLP reads its buckets in reverse ready order)
    # within the credit, one simulated AllReduce per slice
    assert {"bytescheduler", "slicing-grid"} <= set(notes["anchors"])
    slicing = slicing_of(doc["job"]["collective"])
    assert notes["slicing"] == {"slice_bytes": slicing.slice_bytes, "credit": slicing.credit}
    assert list(slicing.priority) == list(range(len(plan)))[::-1]
    assert notes["overlap"] == "forward" and notes["tail"] == 1
    slices = [t.id for t in disco.strategy.tasks if t.id.startswith("ar")]
    assert len(slices) == sum(len(cut(b["bytes"], slicing.slice_bytes)) for b in plan)
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
                     # compute-bound (16384: at 4096 the sliced schedule hides the compute
                     # under the AllReduces, and fusing it no longer pays)
                     "batch": {"global": 16384}, "strategies": ["disco"],
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


def test_forward_overlap_is_simulated_across_iterations():
    """`bucket_overlap: forward` in the simulator: a forward chunk waits for the previous
    iteration's AllReduce (`previous`: ignored from idle, chained by `chain_iterations`);
    with no bucket held back the first layers' bucket is the last AllReduce, so the period is
    the backward timeline's iteration (and one optimizer.step call per bucket); holding the
    first layers' buckets back and sending them first hides more, and no period beats
    max(T_compute, T_comm)."""
    from topoctl.sim.engine import simulate
    from topoctl.sim.steady import chain_iterations, steady_period
    from topoctl.strategies import disco as d

    cluster = load_cluster(PLANS / "fast4-cluster.yaml")
    _, ctx, (_, ev) = make_plan(cluster, parse_job(JOB), use_cache=False)
    units = d.grad_units(ctx.graph)
    score = d._Scorer(ctx, units, ev.strategy.network, {"none": ctx.host_costs(ctx.hosts[0])})
    cuts = tuple(range(len(units.size)))  # one bucket per parameter
    tasks, sizes, order = score.tasks(Candidate("none", cuts, "forward", 3))
    assert order == issue_order(len(cuts), 3) and sum(sizes) == sum(units.size)
    # the first layer's bucket (the last ready) is all-reduced first of the held-back tail
    first = len(cuts) - 1
    assert order[-3:] == [first, first - 1, first - 2]
    waits = [t.id for t in tasks if f"prev:ar{first}" in t.deps]
    assert waits and all(w.startswith("fwd") for w in waits)
    chained = {t.id: t.deps for t in chain_iterations(tasks, 2)}
    assert f"it0:ar{first}" in chained[f"it1:{waits[0]}"]
    assert not [d for d in chained[f"it0:{waits[0]}"] if "ar" in d]  # from idle: no wait
    simulate(tasks, score.network, record=False)  # one iteration from idle: runs
    backward = score(Candidate("none", cuts))
    calls = len(cuts) * d.step_call(ctx, ctx.hosts[0])  # one optimizer.step per bucket
    assert score(Candidate("none", cuts, "forward", 1)) == pytest.approx(backward + calls,
                                                                         rel=1e-6)
    # the renewal cycle the search scores is the period of iterations back to back
    assert steady_period(tasks, score.network, 3) == pytest.approx(
        score(Candidate("none", cuts, "forward", 3)), rel=1e-9)
    t_compute, t_comm = d.ideal(ctx, units, score)
    best = min(score(Candidate("none", cuts, "forward", t)) for t in range(1, len(cuts) + 1))
    assert max(t_compute, t_comm) - 1e-9 <= best < backward


def test_lab_ranks_pay_the_flatten_of_each_bucket_on_their_main_thread():
    """With the runtime's copy costs (`PlanContext.bucket_copy`, lab ranks) bucket k's
    backward chunk grows by `flatten_s` of its units (per parameter the per-piece time, its
    bytes at the lower of the calibrated and the measured cold rate), in both overlaps; the
    tail chunk and plans without the costs are unchanged."""
    from dataclasses import replace

    from topoctl.strategies import disco as d

    cluster = load_cluster(PLANS / "fast4-cluster.yaml")
    _, ctx, _ = make_plan(cluster, parse_job(JOB), use_cache=False)
    units = d.grad_units(ctx.graph)
    n = len(units.size)
    cuts = (n // 2, n - 1)
    costs = lambda h: ctx.host_costs(h)  # noqa: E731
    lab = replace(ctx, bucket_copy=(4e-6, 13.5e9))
    assert d.flatten_s(ctx, units, 0, n - 1) == 0.0
    want = [d.flatten_s(lab, units, 0, n // 2), d.flatten_s(lab, units, n // 2 + 1, n - 1)]
    assert want[0] == pytest.approx((n // 2 + 1) * 4e-6
                                    + sum(units.size[:n // 2 + 1]) / d.FLATTEN_BYTES_PER_S)
    h = ctx.hosts[0]
    for make in (lambda c: d.partition_tasks(c, units, cuts, costs)[0],
                 lambda c: d.overlap_tasks(c, units, cuts, 1, costs)[0]):
        plain = {t.id: t for t in make(ctx)}
        charged = {t.id: t for t in make(lab)}
        for k in range(3):
            tid = f"bwd{k}@{h}"
            extra = want[k] if k < 2 else 0.0
            assert charged[tid].duration == pytest.approx(plain[tid].duration + extra)


def test_ring_buckets_queue_on_the_groups_connections_in_issue_order():
    """Backward overlap on the ring (`partition_tasks`): every bucket's AllReduce is issued
    when its gradients are flattened (no dependency on the bucket before) in gloo's process
    group (`baseline.GLOO_GROUP`), and the step waits for all of them. A 4 KB bucket issued
    while a 4 MB one is on the wire ends after it (one connection per peer, in issue order);
    sharing the wire instead (no group) it would end first."""
    from dataclasses import replace

    from topoctl.sim.engine import simulate
    from topoctl.sim.tasks import Collective
    from topoctl.strategies import baseline
    from topoctl.strategies import disco as d

    cluster = load_cluster(PLANS / "fast4-cluster.yaml")
    _, ctx, (_, ev) = make_plan(cluster, parse_job(JOB), use_cache=False)
    units = d.grad_units(ctx.graph)
    n = len(units.size)
    big = next(i for i in range(n) if units.size[i] > 1e6)  # the first weight of 4 MB
    cuts = (big, big + 1, n - 1)  # then its neighbour's bias alone, then the rest
    costs = lambda h: ctx.host_costs(h)  # noqa: E731
    tasks, sizes = d.partition_tasks(ctx, units, cuts, costs)
    assert sizes[0] > 1e6 > 1e5 > sizes[1]
    ars = {t.id: t for t in tasks if isinstance(t, Collective)}
    assert all(t.group == baseline.GLOO_GROUP and not [x for x in t.deps if x.startswith("ar")]
               for t in ars.values())
    assert set(ars) <= set(next(t for t in tasks if t.id == f"step@{ctx.hosts[0]}").deps)
    fifo = simulate(tasks, ev.strategy.network).finish
    shared = simulate([replace(t, group=None) if t.id in ars else t for t in tasks],
                      ev.strategy.network).finish
    assert fifo["ar0"] < fifo["ar1"] < fifo["ar2"]
    assert shared["ar1"] < shared["ar0"]  # side by side the small one would overtake
