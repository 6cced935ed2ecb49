"""The planner strategy `trees`: scored by the simulator next to the baseline ring, rendered
with its runtime schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from topoctl.planner import make_plan
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.trees import fusion_caps, with_bucket
from topotrain.collectives import load_schedule

PLANS = Path(__file__).resolve().parents[2] / "plans"
JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "tiny",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 512}},
       "batch": {"global": 64}, "sync": {"bucket": "1MB"},
       "cost": {"method": "roofline", "device": "A100"},
       "strategies": ["baseline", "trees"]}


def test_trees_strategy_wins_on_two_racks_and_carries_its_schedule():
    doc, ctx, evals = make_plan(load_cluster(PLANS / "tworack8-cluster.yaml"), parse_job(JOB),
                                use_cache=False)
    times = {e.strategy.name: e.result.iteration_time for e in evals}
    # two racks joined by 20 Mbit/s cables: a ring crosses them at 20 Mbit/s, 16 trees use all
    # 16 of them; the ring is > 10x slower in the simulator
    assert times["baseline"] > 10 * times["trees"]
    coll = doc["job"]["collective"]
    assert coll["algorithm"] == "trees"
    sched = load_schedule(coll["schedule"])
    assert sched.world_size == len(ctx.hosts) == 8
    assert len(sched.trees) == 16
    notes = next(e.strategy.notes for e in evals if e.strategy.name == "trees")
    assert notes["achieved_over_optimal"] > 0.999 and notes["bound"] == "partition"
    reported = doc["metadata"]["collective"]  # the plan itself states achieved/optimal
    assert reported["achieved_over_optimal"] > 0.999 and reported["bound"] == "partition"
    assert reported["trees"] == 16


def _demo_job(**sync) -> dict:
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    job["strategies"] = ["trees"]
    job["sync"] = job["sync"] | sync
    return job


def test_trees_fuse_the_gradient_into_the_bucket_size_the_simulator_prefers():
    cluster = load_cluster(PLANS / "hetero8-cluster.yaml")
    doc, _, evals = make_plan(cluster, parse_job(_demo_job()), use_cache=False)
    fusion = doc["metadata"]["collective"]["fusion"]
    tried = dict(fusion["candidates"])
    assert sorted(tried) == [4_000_000, 8_000_000, 16_000_000]  # 4 MB doubled to the 15.9 MB
    chosen = min(tried, key=tried.get)
    assert fusion["bucket_bytes"] == chosen
    # the launcher gets the chosen cap, and the plan's buckets are what it makes of the gradient
    assert doc["job"]["bucket_cap_mb"] == round(chosen / 2**20, 6)
    assert len(doc["job"]["collective"]["buckets"]) == fusion["buckets"]
    assert evals[0].result.iteration_time == pytest.approx(tried[chosen], rel=1e-6)
    # the job's own cap, kept with `fusion: fixed`, is the first candidate's plan
    fixed, _, fevals = make_plan(cluster, parse_job(_demo_job(fusion="fixed")), use_cache=False)
    assert fixed["job"]["bucket_cap_mb"] == round(4_000_000 / 2**20, 6)
    assert len(fixed["job"]["collective"]["buckets"]) == 4
    assert "candidates" not in fixed["metadata"]["collective"]["fusion"] or not \
        fixed["metadata"]["collective"]["fusion"]["candidates"]
    assert fevals[0].result.iteration_time == pytest.approx(tried[4_000_000], rel=1e-6)
    assert tried[chosen] < tried[4_000_000]  # hetero8: fill/drain of four pipelines costs


def test_fusion_caps_double_until_one_bucket_holds_the_gradient():
    cluster = load_cluster(PLANS / "hetero8-cluster.yaml")
    _, ctx, _ = make_plan(cluster, parse_job(_demo_job(bucket="3MB")), use_cache=False)
    total = sum(b for *_, b in ctx.graph.gradient_order())
    caps = fusion_caps(ctx)
    assert caps[:3] == [3_000_000, 6_000_000, 12_000_000]
    assert caps[-1] >= total > caps[-2]
    assert fusion_caps(with_bucket(ctx, 10**9)) == [10**9]  # already one bucket


def test_lab_ranks_start_the_tree_runtime_when_their_backward_is_done():
    """More lab ranks than cores: every bucket's runtime time waits for the backward of every
    rank (their compute holds the cores, a lock-step step needs every rank); ranks on hosts
    of their own (GPUs): it starts with its bucket, overlapping the rest of the backward."""
    from topoctl.sim.engine import simulate
    from topoctl.strategies.baseline import backward_task

    def runtime_parts(cluster, job):
        _, ctx, evals = make_plan(cluster, parse_job(job), use_cache=False)
        ev = next(e for e in evals if e.strategy.name == "trees")
        parts = {t.id: t for t in ev.strategy.tasks if t.id.endswith("/cpu")}
        nb = len(ev.strategy.buckets)
        return ev, parts, nb, {backward_task(nb, h) for h in ctx.hosts}

    hetero8 = load_cluster(PLANS / "hetero8-cluster.yaml")
    ev, parts, nb, done = runtime_parts(hetero8, _demo_job(fusion="fixed"))
    assert nb == 4 and len(parts) == nb and len(done) == 8
    for t in parts.values():
        assert done <= set(t.deps), t.id
    res = simulate(ev.strategy.tasks, ev.strategy.network, record=True)
    assert res.start["ar0/cpu"] == pytest.approx(max(res.finish[d] for d in done))

    gpus = _demo_job(fusion="fixed") | {"cost": {"method": "roofline", "device": "A100"}}
    ev, parts, nb, done = runtime_parts(hetero8, gpus)
    assert nb == 4 and len(done) == 8
    assert all(not done & set(t.deps) for t in parts.values())
    res = simulate(ev.strategy.tasks, ev.strategy.network, record=True)
    assert res.start["ar0/cpu"] < max(res.finish[d] for d in done)


def test_fill_drain_gives_each_link_the_credit_of_a_lab_cable_of_its_rate():
    """tworack8: the 20 Mbit/s cables between the racks get two jumbo frames of token credit
    (7.2 ms at their rate, as `topoctl lab` shapes them), the 200 Mbit/s ones 4 ms."""
    from topoctl.collective.trees.pack import plan_trees
    from topoctl.collective.trees.schedule import plan_to_schedule
    from topoctl.fabric.capgraph import build_capgraph
    from topoctl.lab.commands import BURST_S
    from topoctl.sim.fabric import network_from_fabric
    from topoctl.sim.routing import shortest_next_hops
    from topoctl.strategies.trees import tree_links

    fabric = load_cluster(PLANS / "tworack8-cluster.yaml").graph()
    hosts = list(fabric.hosts)
    net = network_from_fabric(fabric, shortest_next_hops(fabric, required=hosts))
    rate: dict[tuple[str, str], float] = {}
    for ln in net.links.values():
        rate[(ln.src, ln.dst)] = rate[(ln.dst, ln.src)] = ln.capacity
    g = build_capgraph([(a, b, c) for (a, b), c in rate.items() if a < b], hosts)
    sched = plan_to_schedule(plan_trees(g), chunk_bytes=1 << 16)
    fd = tree_links(sched, hosts, net, fabric.mtu)
    assert fd.credit_s.shape == (fd.steps.shape[0],)
    slow = 2 * 9014 * 8 / 20e6
    assert sorted({round(c, 6) for c in fd.credit_s}) == [round(BURST_S, 6), round(slow, 6)]


def test_ranks_leave_the_last_tree_allreduce_one_by_one_and_the_period_is_predicted():
    """tworack8: the trees' roots and shallow ranks leave the last bucket's AllReduce before
    the deepest leaves; each host's optimizer step waits for its own part only, and the plan
    predicts the steady-state period of back-to-back iterations. The lab's ranks share the
    cores: the time a rank leaves early counts only in the share of the cores the runtime
    leaves free (1 - CPU part / bucket time)."""
    from topoctl.collective.trees.pipeline import leave_fractions, tree_shape
    from topoctl.planner import STEADY_ITERATIONS
    from topoctl.render.explain import explain_text
    from topoctl.sim.steady import steady_period
    from topoctl.sim.tasks import Collective, member_done

    job = _demo_job() | {"strategies": ["baseline", "trees"]}
    doc, ctx, evals = make_plan(load_cluster(PLANS / "tworack8-cluster.yaml"), parse_job(job),
                                use_cache=False)
    ev = {e.strategy.name: e for e in evals}
    trees = ev["trees"].strategy
    colls = [t for t in trees.tasks if isinstance(t, Collective)]
    last = colls[-1]
    assert last.member_done and not any(c.member_done for c in colls[:-1])
    tasks = {t.id: t for t in trees.tasks}
    whole = tasks[f"{last.id}/cpu"].duration
    runtime = trees.notes["runtime"]
    assert runtime["ranks_per_core"] > 1  # 8 lab ranks on the default calibration's 2 cores
    assert len(colls) == 1  # the gradient fused into one bucket (16 MB: fastest here)
    busy = min(1.0, runtime["cpu_s"] / max(runtime["network_s"], runtime["cpu_s"]))
    sched = load_schedule(trees.collective["schedule"])
    shape = tree_shape([t.parents for t in sched.trees], [t.rate for t in sched.trees])
    raw = dict(zip(ctx.hosts, leave_fractions(shape, runtime["chunks"]), strict=True))
    assert min(raw.values()) < 0.95 and max(raw.values()) == 1.0
    for h in ctx.hosts:
        part = tasks[f"{last.id}/cpu@{h}"].duration
        assert part == pytest.approx(whole * (1 - (1 - raw[h]) * (1 - busy)))
        assert set(tasks[f"step@{h}"].deps) >= {member_done(last.id, h), f"{last.id}/cpu@{h}"}
        assert last.id not in tasks[f"step@{h}"].deps
    res = ev["trees"].result
    assert res.iteration_time == pytest.approx(
        steady_period(trees.tasks, trees.network, STEADY_ITERATIONS))
    # the prediction's compute is the hosts' (the runtime's pseudo-devices are communication)
    assert res.compute_time == pytest.approx(max(res.device_busy[h] for h in ctx.hosts))
    assert res.compute_time < res.device_busy[f"trees-cpu/{last.id}"]
    assert doc["metadata"]["strategy"] == "trees"
    assert doc["metadata"]["prediction"]["isolated_iteration"] == pytest.approx(
        res.isolated_iteration)
    assert "steady state: ranks leave the AllReduce one by one" in explain_text(doc)
    # a ring's members leave together: its prediction stays the one iteration
    assert ev["baseline"].result.isolated_iteration is None
