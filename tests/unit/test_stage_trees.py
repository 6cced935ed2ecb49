"""Packed trees as a per-stage sync the planner picks: with the tree runtime's per-rank CPU
model per stage (`placement.stagesync.tree_cpu`), a hybrid plan on two cliques of three hosts
(each pair of a clique joined by its own cable: trees use both directions of every cable,
gloo's ring one) states `trees` on both stages, with a schedule over the stage's replicas that
validates; a stage whose hosts have no cables between them gets no trees option; the CPU model
charges every member and runs alongside the collective."""

from __future__ import annotations

import pytest

from tests.unit.test_stage_sync import JOB, PARAMS, _cluster
from topocontract.stages import sync_problems, tree_schedule
from topoctl.collective.trees.pipeline import runtime_costs
from topoctl.placement.stagesync import stage_trees, sync_tasks, tree_cpu
from topoctl.planner import make_plan
from topoctl.render.explain import explain_text
from topoctl.render.validate import validate_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

JOB6 = {**JOB, "batch": {"global": 96}}  # 6 ranks, 3 replicas x 4 micro-batches


def cliques6() -> dict:
    """h0-h2 and h3-h5 fully meshed at 1 Gbit/s, h_i cabled to h_(i+3) at 10 Gbit/s; slow
    devices, memory for half the model: two stages of three replicas."""
    links = []
    for b in (0, 3):
        h = [f"h{b + i}" for i in range(3)]
        links += [(h[0], h[1], "1gbit"), (h[1], h[2], "1gbit"), (h[2], h[0], "1gbit")]
    links += [(f"h{i}", f"h{i + 3}", "10gbit") for i in range(3)]
    doc = _cluster(links, "tst-cliques6", 6)
    doc["gpu_types"]["small"].update(peak_flops=1e9, memory=0.7 * 4 * PARAMS)
    return doc


@pytest.fixture(scope="module")
def plan():
    doc, _, _ = make_plan(parse_cluster(cliques6()), parse_job(JOB6), use_cache=False)
    return doc


def test_the_planner_picks_trees_per_stage(plan):
    stages = plan["job"]["collective"]["stages"]
    assert [st["hosts"] for st in stages] == [["h0", "h1", "h2"], ["h3", "h4", "h5"]]
    assert [st["sync"]["kind"] for st in stages] == ["trees", "trees"]
    for st, note in zip(stages, plan["metadata"]["collective"]["sync"], strict=True):
        assert tree_schedule(st).world_size == 3
        opts = note["options_s"]
        assert opts["trees"] == min(opts.values()) and opts["trees"] < opts["ring"]
    assert validate_plan(plan) == [] and sync_problems(plan["job"]["collective"]) == []
    assert "sync trees (" in explain_text(plan)


def test_no_trees_without_cables_between_the_stage_hosts():
    links = [("a", "x", 1e8), ("b", "x", 1e8)]  # a and b meet only through x
    assert stage_trees(links, ["a", "b"], 1e6, runtime_costs(None)) is None
    assert stage_trees([("a", "b", 1e8)], ["a"], 1e6, runtime_costs(None)) is None


def test_the_tree_cpu_charges_every_member_alongside_the_collective():
    links = [("a", "b", 1.25e8), ("b", "c", 1.25e8), ("c", "a", 1.25e8)]
    costs = runtime_costs(None)
    sched = stage_trees(links, ["a", "b", "c"], 4e6, costs)
    cpu = tree_cpu(costs)(sched, 4e6)
    assert len(cpu) == 3 and all(x > 0 for x in cpu)
    assert max(cpu) < 4e6 / 1.25e8  # far below the network part here
    tasks, done = sync_tasks("s", ["a", "b", "c"], {"kind": "trees", "schedule": sched.dump()},
                             4e6, ("before",), None, tree_cpu(costs))
    by = {t.id: t for t in tasks}
    assert by["s/cpu.0"].deps == ("before",)  # starts with the collective, not after it
    assert set(by[done["a"]].deps) == {"s", "s/cpu.0"}
