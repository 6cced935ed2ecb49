"""Batch shares by speed (`+shares`): the apportionment (integers summing to the global batch,
within one sample of the exact quota, deterministic), the plan (shares in `job.batch.shares`,
each host's compute scaled by its share and speed, valid launch spec, explain) and the launch
spec's checks of the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from topoagent.state.host import StateError
from topoagent.state.wire import parse_launch_spec, plan_problems
from topoctl.apportion import apportion
from topoctl.planner import make_plan
from topoctl.render.explain import explain_text
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job
from topotrain.shares import loss_weight

PLANS = Path(__file__).resolve().parents[2] / "plans"
SPEEDS = [2.0, 2.0, 1.0, 1.0, 0.5, 0.5, 3.0, 2.0]  # hetero8's h0..h7
JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "sh",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 256}},
       "batch": {"global": 384}, "sync": {"bucket": "4MB"}, "cost": {"method": "roofline"},
       "strategies": ["baseline", "baseline+shares"]}


@pytest.mark.parametrize("total, speeds", [
    (384, SPEEDS), (10, [1, 1, 1]), (7, [3.3, 1.1, 0.7]), (5, [100, 1, 1, 1, 1]),
    (1000, [0.1 * i + 0.05 for i in range(1, 12)])])
def test_shares_add_up_and_stay_within_one_sample_of_the_quota(total, speeds):
    got = apportion(total, speeds)
    assert sum(got) == total and min(got) >= 1
    quota = [total * s / sum(speeds) for s in speeds]
    assert all(abs(g - q) < 1 or g == 1 for g, q in zip(got, quota, strict=True))
    assert apportion(total, speeds) == got  # deterministic


def test_shares_examples():
    assert apportion(384, SPEEDS) == [64, 64, 32, 32, 16, 16, 96, 64]
    assert apportion(384, [2, 2, 1, 1, 0.5, 0.5, 1.5, 1]) == [81, 81, 41, 40, 20, 20, 61, 40]
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]  # the remainder to the lowest rank
    assert apportion(5, [100, 1, 1, 1, 1]) == [1, 1, 1, 1, 1]  # everyone takes one
    with pytest.raises(ValueError):
        apportion(2, [1, 1, 1])
    with pytest.raises(ValueError):
        apportion(8, [1, 0])


@pytest.mark.parametrize("total, n", [(10, 3), (64, 4), (7, 7), (97, 5)])
def test_equal_speeds_split_evenly_the_first_members_one_more(total, n):
    # the pipeline's rows over a stage's replicas (`strategies.placement.search_shape`)
    q, extra = divmod(total, n)
    assert apportion(total, [1.0] * n) == [q + (j < extra) for j in range(n)]


def _cluster(speeds):
    doc = yaml.safe_load((PLANS / "hetero8-cluster.yaml").read_text())
    for h, s in zip(doc["hosts"], speeds, strict=True):
        h["speed"] = s
    return parse_cluster(doc)


def test_plan_carries_shares_and_scales_compute():
    doc, ctx, evals = make_plan(_cluster(SPEEDS), parse_job(JOB), use_cache=False)
    by = {e.strategy.name: e for e in evals}
    base, sh = by["baseline"].strategy, by["baseline+shares"].strategy
    want = apportion(384, SPEEDS)
    assert sh.collective["shares"] == want
    dur = {t.id: t.duration for t in base.tasks if hasattr(t, "duration")}
    for t in sh.tasks:
        if t.id.startswith(("fwd@", "bwd")):
            h = t.id.split("@")[1]
            r = ctx.ranks[h][0]
            assert t.duration == pytest.approx(dur[t.id] * want[r] / 48)
        elif hasattr(t, "duration"):
            assert t.duration == dur[t.id]  # the optimiser step does not change
    # the planner runs every strategy at its hosts' speeds, once (`planner.host_speeds`)
    speed = {h: SPEEDS[ctx.ranks[h][0]] for h in ctx.hosts}
    assert sh.network.speed == base.network.speed == speed
    # 32 samples per unit of speed: every host computes for as long as the others
    fwd = [t.duration / speed[t.id.split("@")[1]] for t in sh.tasks if t.id.startswith("fwd@")]
    assert max(fwd) == pytest.approx(min(fwd), rel=1e-9)
    assert max(fwd) == pytest.approx(dur["fwd@h0"] * 32 / 48, rel=1e-9)
    # the shares plan as rendered
    job = dict(JOB, strategies=["baseline+shares"])
    plan, _, _ = make_plan(_cluster(SPEEDS), parse_job(job), use_cache=False)
    assert plan_problems(plan) == []
    assert plan["job"]["batch"] == {"global": 384, "per_rank": 48, "shares": want}
    assert "shares" not in plan["job"]["collective"]
    text = explain_text(plan)
    assert "batch shares by speed: h0 [64] (speed 2), h1 [64] (speed 2), h2 [32] (speed 1)" in text


def test_even_speeds_give_even_shares_and_the_baseline_time():
    doc, _ctx, evals = make_plan(_cluster([None] * 8), parse_job(JOB), use_cache=False)
    t = {e.strategy.name: e.result.iteration_time for e in evals}
    assert t["baseline+shares"] == pytest.approx(t["baseline"], rel=1e-12)
    assert evals[1].strategy.collective["shares"] == [48] * 8


def ranks(n: int) -> dict:
    """`n` ranks on one host, as a launch spec lists them."""
    return {"h0": [{"rank": r, "local_rank": r} for r in range(n)]}


def test_launch_spec_checks_shares():
    spec = {"name": "t", "command": ["x"], "world_size": 2,
            "master": {"address": "10.0.0.1", "port": 1}, "model": {}, "processes": ranks(2),
            "batch": {"global": 8, "per_rank": 4, "shares": [3, 5]}}
    assert parse_launch_spec(spec).batch.samples(0) == 3
    for batch, world, sfb, where in [({"shares": [3, 4]}, 2, [], "job.batch"),
                                     ({}, 3, [], "job"),
                                     ({"shares": [0, 8]}, 2, [], "job.batch.shares[0]"),
                                     ({}, 2, ["net.0"], "job")]:
        bad = spec | {"world_size": world, "batch": spec["batch"] | batch,
                      "processes": ranks(world),
                      **({"sfb": sfb} if sfb else {})}
        with pytest.raises(StateError) as e:
            parse_launch_spec(bad)
        assert e.value.problems[0][0] == where, e.value.problems



def test_loss_weights_make_the_average_the_whole_batch_mean():
    spec = parse_launch_spec({"name": "t", "command": ["x"], "world_size": 3,
                              "master": {"address": "10.0.0.1", "port": 1}, "model": {},
                              "processes": ranks(3), "batch": {"global": 16, "per_rank": 5,
                                                         "shares": [9, 3, 4]}})
    w = [loss_weight(spec.batch, r, 3) for r in range(3)]
    assert w == pytest.approx([27 / 16, 9 / 16, 12 / 16])
    # (1/P) sum_r w_r L_r = sum_r n_r L_r / N: the whole batch's mean of per-sample losses
    assert sum(w) / 3 == pytest.approx(1.0)
    even = spec.batch.model_copy(update={"shares": None})
    assert loss_weight(even, 1, 3) == 1.0
