"""TAG (`topoctl.tag`, strategy `tag`): the space, the search against the exhaustive optimum on
small cases under the project's simulator (evaluation 3: <= 4 hosts, <= 6 op-groups, within
2%), determinism, and a plan `topoctl plan` writes, validates and `explain` shows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.common import job
from topoctl.cli import main
from topoctl.planner import Evaluated, prepare
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import load_job, parse_job
from topoctl.strategies.tag import kit
from topoctl.tag import exhaustive, mcts
from topoctl.tag.clusters import generated
from topoctl.tag.emit import notes, pipeline_strategy
from topoctl.tag.evaluator import Evaluator, reward
from topoctl.tag.problem import build_space, op_groups
from topoctl.tag.search import run_search
from topoctl.tag.space import Space, complete, legal, plan_of

PLANS = Path(__file__).resolve().parents[2] / "plans"
KIT = kit()


def _walk(space: Space, state=()):
    acts = legal(space, state)
    if not acts:
        yield state
    for a in acts:
        yield from _walk(space, state + (a,))


def test_space_equal_replicas_and_completion():
    sp = Space(("a", "b", "c", "d"), 3, (1, 2), ("ring",), frozenset({1}))
    states = list(_walk(sp))
    assert len(states) == exhaustive.count(sp)
    for s in states:
        p = plan_of(s)
        if p.form == "pp":  # disjoint stages of equal replica counts (the runtime's rule)
            hosts = [h for st in p.stages for h in st.hosts]
            assert len(hosts) == len(set(hosts))
            assert len({len(st.hosts) for st in p.stages}) == 1
    # every partial state completes to a legal complete state
    part = (("stage", ("a", "b"), "ring"),)
    full = complete(sp, part)
    assert full in set(states) and plan_of(full).stages[0].last == 2
    assert complete(sp, ()) == (("dp", "ring", False), ("ar",), ("ar",))
    wide = Space(("a", "b", "c", "d"), 2, (1, 2), equal_replicas=False)  # the documented hook
    assert any(len(a[1]) == 2 for a in legal(wide, (("stage", ("a",), "none"),))
               if a[0] == "stage")


def test_mcts_finds_the_optimum_of_a_synthetic_reward():
    sp = Space(("a", "b", "c"), 4, (1, 3), ("ring", "trees"), frozenset({0, 2}))

    def score(s):  # a reward with one best plan deep in the tree
        p = plan_of(s)
        if p.form == "dp":
            return 0.1 * len(p.sfb)
        return 0.2 * len(p.stages) + (0.5 if p.stages[-1].hosts == ("a",) else 0.0)

    best_s, best_v, _ = exhaustive.optimum(sp, score)
    res = mcts.search(lambda s: legal(sp, s), lambda s: (score(complete(sp, s)), complete(sp, s)),
                      400, seed=1)
    assert res.best_value == pytest.approx(best_v)


def _ctx(cluster, jobdoc):
    return prepare(cluster, parse_job(jobdoc), use_cache=False)


CASES = [("gen4-1", "vgg", 256), ("gen4-2", "mlp", 512), ("hetero4c", "mlp", 384)]


@pytest.mark.parametrize("case,model,batch", CASES)
def test_search_within_two_percent_of_exhaustive(case, model, batch):
    cluster = (load_cluster(PLANS / "hetero4-compute-cluster.yaml") if case == "hetero4c"
               else parse_cluster(generated(4, int(case[-1]))))
    ctx = _ctx(cluster, job(model, {}, batch))
    out = run_search(ctx, KIT, 300, seed=0, max_groups=6, widen=False)  # equal replica counts
    assert len(out.groups) <= 6
    ev, sp = out.evaluator, out.space
    _, best_v, n = exhaustive.optimum(sp, lambda s: reward(out.base_time, ev.time(plan_of(s))))
    t_opt = min(ev.cache[p] for p in ev.cache)  # every plan the enumeration valued
    assert n > 50  # a real search space, not the anchors alone
    assert out.time <= 1.02 * t_opt, (out.time, t_opt)


def test_widened_plan_validates_and_simulates():
    """A plan of the widened space (stage 0 on three hosts synced by packed trees with batch
    shares by speed, stage 1 on one host) simulates and renders to a plan the runtime's
    contract accepts: unequal replica counts, `shares` summing to the micro-batch."""
    from topoctl.planner import render
    from topoctl.render.validate import validate_plan
    from topoctl.sim.engine import simulate
    from topoctl.tag.space import Plan, Stage

    ctx = _ctx(load_cluster(PLANS / "hetero4-compute-cluster.yaml"), job("mlp", {}, 384))
    groups = op_groups(ctx, 4, KIT)
    ev = Evaluator(ctx, groups, KIT)
    sp = build_space(ctx, groups, ("ring",), KIT, True, ev.times)
    assert not sp.equal_replicas and "trees" in sp.stage_syncs
    assert ("stage", ("h0", "h1", "h2"), "trees+shares") in legal(sp, ())
    plan = Plan("pp", stages=(Stage(0, 1, ("h0", "h1", "h2"), "trees+shares"),
                              Stage(2, len(groups) - 1, ("h3",), "none")))
    t = ev.time(plan)
    assert 0 < t < float("inf")
    s = pipeline_strategy(ctx, plan, ev)
    st = s.collective["stages"]
    assert [len(x["hosts"]) for x in st] == [3, 1] and st[0]["sync"]["kind"] == "trees"
    assert sum(st[0]["shares"]) == sum(st[1]["shares"]) == 384 // ctx.job.parallelism.microbatches
    assert st[0]["shares"][0] > st[0]["shares"][1]  # h0 (speed 1) takes more than h1 (0.5)
    res = simulate(s.tasks, s.network, record=False)
    doc = render(ctx, Evaluated(s, res, 0.0), [])
    assert validate_plan(doc) == []


def test_deterministic_for_a_seed():
    ctx = _ctx(parse_cluster(generated(4, 2)), job("vgg", {}, 256))
    a = run_search(ctx, KIT, 150, seed=3)
    b = run_search(ctx, KIT, 150, seed=3)
    assert a.state == b.state and a.result.root_visits == b.result.root_visits
    assert a.result.targets == b.result.targets


def test_plan_runs_through_plan_and_explain(tmp_path, capsys):
    """`topoctl plan` with strategies [tag] writes a valid plan (the schema `apply` and `run`
    read), twice the same bytes; `explain` shows each op-group's decision."""
    spec = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    spec["strategies"] = ["tag", "baseline"]
    spec["tag"] = {"playouts": 200}
    jf = tmp_path / "job.yaml"
    jf.write_text(yaml.safe_dump(spec))
    outs = []
    for i in range(2):
        out = tmp_path / f"plan{i}.yaml"
        assert main(["plan", str(PLANS / "hetero4-compute-cluster.yaml"), str(jf), "-o",
                     str(out), "--no-cache"]) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    doc = yaml.safe_load(outs[0])
    assert doc["metadata"]["strategy"] == "tag"
    assert "tag" in doc["metadata"]["collective"]
    capsys.readouterr()
    assert main(["explain", str(tmp_path / "plan0.yaml")]) == 0
    text = capsys.readouterr().out
    assert "TAG group 0:" in text


def test_job_options_are_checked():
    spec = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    spec["tag"] = {"playouts": 0}
    with pytest.raises(Exception, match="tag.playouts"):
        parse_job(spec, "job.yaml")
    assert load_job(PLANS / "mlp-job.yaml").tag.playouts >= 1


def test_budget_interrupts_a_seed_and_the_search_still_plans():
    """`call_until` abandons a call at its deadline (and leaves an outer timer armed); with
    almost no time the strategy still returns a plan, and says which seeds ran out."""
    import signal
    import time

    from topoctl.tag.budget import OutOfTime, call_until

    def spin() -> None:
        while True:
            pass

    outer = signal.getitimer(signal.ITIMER_REAL)[0]
    t0 = time.perf_counter()
    with pytest.raises(OutOfTime):
        call_until(spin, t0 + 0.2)
    assert time.perf_counter() - t0 < 2
    assert call_until(lambda: 7, time.perf_counter() + 5) == 7
    assert (signal.getitimer(signal.ITIMER_REAL)[0] > 0) == (outer > 0)
    ctx = _ctx(parse_cluster(generated(4, 2)), job("mlp", {}, 512))
    out = run_search(ctx, KIT, 100, time_limit=1e-3, seed_share=0.5)
    assert "seed trees" in out.cut and "tree search" in out.cut and out.result.stopped_by_time
    assert out.time < float("inf")
    rec = notes(out)  # the plan says the clock cut it, and what
    assert rec["time_limit"] == 1e-3 and "seed trees" in rec["cut_short"]
    assert "may differ" in rec["cut_short_note"]


def test_the_default_budget_is_counted():
    """Without `tag.time_limit` (the default) no clock limits the search: every seed runs,
    the tree runs its playouts and the walk its steps, and the plan records the counts and no
    `time_limit` or `cut_short`."""
    assert load_job(PLANS / "mlp-job.yaml").tag.time_limit is None
    ctx = _ctx(parse_cluster(generated(4, 2)), job("mlp", {}, 512))
    out = run_search(ctx, KIT, 60, seed=1)
    assert out.cut == [] and not out.result.stopped_by_time
    assert out.walk is not None and out.walk["steps"] == 60
    rec = notes(out)
    assert rec["playouts_budget"] == 60
    assert "time_limit" not in rec and "cut_short" not in rec


def test_valued_period_is_the_planners():
    """The time TAG values a plan at is what `planner.evaluate` would simulate for it (the
    steady-state period of a tree plan whose ranks leave one by one), so the emitted plan
    hands it on (`Strategy.period`) instead of the planner simulating it again."""
    from dataclasses import replace

    from topoctl import planner
    from topoctl.sim.steady import steady_period
    from topoctl.sim.tasks import Collective
    from topoctl.strategies import host_speeds
    from topoctl.tag.space import Plan

    ctx = _ctx(load_cluster(PLANS / "hetero4-compute-cluster.yaml"), job("mlp", {}, 384))
    ev = Evaluator(ctx, op_groups(ctx, 4, KIT), KIT)
    s = ev.dp_strategy("trees")
    assert any(isinstance(t, Collective) and t.member_done for t in s.tasks)
    net = replace(s.network, speed=host_speeds(ctx), _cache={})
    assert ev.time(Plan("dp", "trees")) == steady_period(s.tasks, net,
                                                         planner.STEADY_ITERATIONS)


def test_walk_after_the_tree_is_the_evaluations_mcmc():
    """The MCMC walk after the tree is FlexFlow's walk of the evaluation (same seed, steps,
    start and values): the result is never slower than it, and the plan records it."""
    from topoctl.tag import mcmc

    ctx = _ctx(parse_cluster(generated(4, 1)), job("vgg", {}, 256))
    out = run_search(ctx, KIT, 150, seed=0, max_groups=6)
    assert out.walk is not None and out.walk["steps"] == 150 and not out.cut
    ev = out.evaluator
    best, _, _ = mcmc.search(out.space, lambda s: reward(out.base_time, ev.time(plan_of(s))),
                             150, seed=0)
    assert out.time <= ev.time(plan_of(best))
    assert "walk" in notes(out)


def test_the_placement_plan_wins_when_faster_or_tied_on_fewer_hosts():
    from topoctl.tag.emit import TIE, placement_wins

    assert placement_wins(0.100, 2, 0.101, 1)  # faster wins whatever its hosts
    assert placement_wins(0.105, 1, 0.105, 2)  # a tie: fewer hosts
    assert placement_wins(0.105 * (1 + TIE), 1, 0.105, 2)
    assert not placement_wins(0.105 * (1 + 2 * TIE), 1, 0.105, 2)  # slower than a tie
    assert not placement_wins(0.105, 2, 0.105, 2)  # a tie on as many hosts: the search's
    assert not placement_wins(0.105, 3, 0.105, 2)
