"""Pipeline stages with unequal replica counts: the contract (`shares`: rows of each
micro-batch per replica; every stage's sum the same; bad shares name the YAML path), the row
pieces that cross a boundary, and the simulator: an equal-count plan stated through shares
simulates exactly as before, and a 2 -> 1 plan (`search_shape`) states its shares, validates
and predicts."""

from __future__ import annotations

import pytest

from tests.unit.test_stage_sync import JOB, PARAMS, _ring_cluster
from topocontract.stages import pieces, stage_shares, sync_problems
from topoctl.pipeline.gpipe import pipeline_tasks
from topoctl.planner import prepare
from topoctl.render.explain import stage_lines
from topoctl.sim.engine import simulate
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import JobError, parse_job
from topoctl.strategies.placement import search, search_shape


def _coll(*shares, micro=4) -> dict:
    stages, rank = [], 0
    for sh in shares:
        n = len(sh) if sh else 2
        st = {"hosts": [f"h{rank + i}" for i in range(n)], "ranks": list(range(rank, rank + n)),
              "ops": ["x"]}
        if sh:
            st["shares"] = sh
        stages.append(st)
        rank += n
    return {"algorithm": "pipeline", "micro_batch": micro, "stages": stages}


def test_pieces_split_and_gather_by_rows():
    assert pieces([4, 4], [8]) == [(0, 0, 0, 4), (1, 0, 4, 8)]  # gather
    assert pieces([8], [3, 5]) == [(0, 0, 0, 3), (0, 1, 3, 8)]  # split, unevenly
    assert pieces([4, 4], [4, 4]) == [(0, 0, 0, 4), (1, 1, 4, 8)]  # replica to replica
    assert pieces([3, 1], [1, 3]) == [(0, 0, 0, 1), (0, 1, 1, 3), (1, 1, 3, 4)]
    # every row crosses exactly once, in order
    got = pieces([2, 3, 3, 1], [5, 1, 3])
    assert [(lo, hi) for _, _, lo, hi in got] == [(0, 2), (2, 5), (5, 6), (6, 8), (8, 9)]


def test_shares_validate_and_default_to_the_micro_batch():
    ok = _coll(None, [8])  # 2 x 4 rows, then one replica of 8
    assert sync_problems(ok) == [] and stage_shares(ok) == [[4, 4], [8]]
    assert sync_problems(_coll([3, 5], [8], [2, 2, 4])) == []


@pytest.mark.parametrize("coll,path,words", [
    (_coll(None, [7]), "job.collective.stages[1].shares", "7 rows"),
    (_coll(None, [8, 0]), "job.collective.stages[1].shares", "positive integers"),
    (_coll(None, [4]), "job.collective.stages[1].shares", "4 rows"),
    (_coll(None, [8], micro=None), "job.collective.micro_batch", "positive integer"),
])
def test_bad_shares_name_the_yaml_path(coll, path, words):
    if path.endswith("[1].shares") and coll["stages"][1]["shares"] == [8, 0]:
        coll["stages"][1]["ranks"] = [2, 3]
        coll["stages"][1]["hosts"] = ["h2", "h3"]
    bad = sync_problems(coll)
    assert [p for p, _ in bad] == [path] and words in bad[0][1], bad


@pytest.fixture(scope="module")
def ctx():
    return prepare(parse_cluster(_ring_cluster(8, 0.7 * 4 * PARAMS)), parse_job(JOB),
                   use_cache=False)


def test_an_equal_plan_through_shares_simulates_as_before(ctx):
    s = search(ctx, "partition", "x", replicas=2, split=True)
    coll = s.collective
    stages = [st["ops"] for st in coll["stages"]]
    groups = [st["hosts"] for st in coll["stages"]]
    syncs = [st["sync"] for st in coll["stages"]]
    micro, rows = coll["microbatches"], coll["micro_batch"]
    scale = rows / ctx.local_batch
    before, _ = pipeline_tasks(ctx, stages, groups, micro, scale, None, syncs)
    rowwise, _ = pipeline_tasks(ctx, stages, groups, micro, scale / rows, None, syncs,
                                [[rows] * len(g) for g in groups], None)
    t0 = simulate(before, s.network, record=False).iteration_time
    t1 = simulate(rowwise, s.network, record=False).iteration_time
    assert t1 == pytest.approx(t0, rel=1e-9)


def test_a_two_to_one_shape_states_its_shares_and_predicts(ctx):
    s = search_shape(ctx, [2, 1], "x")
    coll = s.collective
    assert [st["hosts"] for st in coll["stages"]] == [["h0", "h1"], ["h2"]]
    assert [st["shares"] for st in coll["stages"]] == [[8, 8], [16]]  # 64 rows / 4 micro
    assert [st["sync"]["kind"] for st in coll["stages"]] == ["ring", "none"]
    assert sync_problems(coll) == []
    assert sorted(o for st in coll["stages"] for o in st["ops"]) == sorted(
        o.name for o in ctx.graph.ops)
    t = simulate(s.tasks, s.network, record=False).iteration_time
    assert t == pytest.approx(s.notes["iteration_s"]) and t > 0
    # each stage-0 replica sends its 8 rows to the lone stage-1 replica, which sends each
    # its rows' gradients back: one transfer per piece and micro-batch
    moves = {t.id: t for t in s.tasks if t.id.startswith(("act", "grad"))
             and "/" not in t.id}
    assert sorted(moves) == sorted(f"{k}0.{m}.{a}.{b}" for m in range(4)
                                   for k, a, b in [("act", 0, 0), ("act", 1, 0),
                                                   ("grad", 0, 0), ("grad", 0, 1)])
    assert moves["act0.0.0.0"].src == "h0" and moves["grad0.0.0.1"].dst == "h1"
    assert "rows 8/8" in "\n".join(stage_lines({"job": {"collective": coll}}))


def test_a_shape_that_does_not_fit_is_a_job_error(ctx):
    with pytest.raises(JobError, match="shape"):
        search_shape(ctx, [8, 2], "x")
