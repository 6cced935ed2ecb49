"""The planner strategy `trees`: scored by the simulator next to the baseline ring, rendered
with its runtime schedule."""

from __future__ import annotations

from pathlib import Path

from topoagent.collectives import load_schedule
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import parse_job

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
