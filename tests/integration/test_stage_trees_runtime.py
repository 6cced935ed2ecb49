"""A stage sync of packed trees that the planner picked, run for real: the planner's tree
schedules of a hybrid plan on two cliques of three hosts (`tests/unit/test_stage_trees.py`)
drive the tree runtime over each stage's three gloo processes; over 5 steps (the 20-step
comparison of a hand-written tree schedule is `test_stage_sync_runtime.py`'s) the losses equal
single-process training on the whole batch and each stage's replicas end identical."""

from __future__ import annotations

import pytest

from tests.integration.test_pipeline_runtime import reference_losses, run_local
from tests.integration.test_stage_sync_runtime import MICRO, MICROBATCHES, launch
from tests.unit.test_stage_trees import JOB6, cliques6
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

ITERS = 5  # kept short: the suite's budget


def test_the_planned_stage_trees_run_and_train_as_one_process(tmp_path):
    doc, _, _ = make_plan(parse_cluster(cliques6()), parse_job(JOB6), use_cache=False)
    syncs = [st["sync"] for st in doc["job"]["collective"]["stages"]]
    assert [s["kind"] for s in syncs] == ["trees", "trees"]
    # the planned schedules over the stages' replicas, on the small runtime test model (the
    # schedule's chunk size was picked for the planned model's larger gradient: smaller, so
    # that this one's is cut into several chunks too)
    for s in syncs:
        s["schedule"]["chunk_bytes"] = 4096
    job = launch(syncs, 3)
    job["iterations"] = ITERS
    events = run_local(job, tmp_path)
    ref = reference_losses(job, MICRO * MICROBATCHES * 3)
    losses = {}
    for e in events:
        if e.get("event") == "iter" and e.get("loss") is not None:
            losses.setdefault(e["iter"], []).append(e["loss"])
    assert sorted(losses) == list(range(ITERS))
    for it in range(ITERS):
        for got in losses[it]:
            assert got == pytest.approx(ref[it], rel=2e-5, abs=1e-6), it
    assert {e["sync"] for e in events if e.get("event") == "start"} == {"trees"}
    sums: dict[int, set] = {}
    for e in events:
        if e.get("event") == "done":
            sums.setdefault(e["stage"], set()).add(e["checksum"])
    assert len(sums) == 2 and all(len(v) == 1 for v in sums.values())
