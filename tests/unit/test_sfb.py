"""Sufficient-factor broadcasting: the 0/1 program (`topoctl.sfb.program`) picks SFB for
small per-replica batches and wide layers and not otherwise, at the crossover the formula
gives, and takes a factor shared by two layers into account; the `+sfb` post-pass plans on
hetero8 (layers chosen, buckets without them, faster in the simulator), renders `job.sfb` and
`explain` names the layers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from topoagent.state.wire import plan_problems
from topoctl.cli import main
from topoctl.planner import evaluate, make_plan, prepare
from topoctl.sfb.program import SfbLayer, choose_layers, factor_values
from topoctl.sim.engine import simulate
from topoctl.sim.network import CpuPool
from topoctl.sim.tasks import Collective
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import parse_job

PLANS = Path(__file__).resolve().parents[2] / "plans"
B = 1.25e8  # bytes/s per replica (1 Gbit/s)
FLOPS = 1e11


def layer_costs(k: int, p: int, m: int, n: int, name: str = "fc"):
    """A layer and its gather times under the plain bandwidth model of the issue."""
    extra = (p - 1) * 2 * k * m * n / FLOPS
    saved = 2 * (p - 1) / p * 4 * m * n / B
    gather = {f"x:{name}": (p - 1) * 4 * k * m / B, f"d:{name}": (p - 1) * 4 * k * n / B}
    return SfbLayer(name, (f"x:{name}", f"d:{name}"), extra, saved), gather


@pytest.mark.parametrize("k, m, n, want", [
    (4, 4096, 4096, True),     # small batch, wide layer: SFB
    (4096, 4096, 4096, False),  # large batch: the factors outweigh the gradient
    (4, 4096, 10, False),       # narrow layer: its gradient is small already
    (256, 4096, 4096, False),   # below the traffic crossover (512 rows), but the extra
                                # compute of rebuilding the gradient tips it
])
def test_program_picks_sfb_for_small_batches_and_wide_layers(k, m, n, want):
    ly, gather = layer_costs(k, 8, m, n)
    got = choose_layers([ly], gather)
    assert (got.layers == ("fc",)) is want
    if want:
        assert got.objective < 0 and set(got.tensors) == {"x:fc", "d:fc"}
    else:
        assert got.objective == 0 and got.tensors == ()


def test_crossover_batch_is_the_formulas():
    # communication only (no extra compute): SFB wins while K (P-1)(M+N) < 2 (P-1)/P M N
    p, m, n = 8, 2048, 1024
    cross = 2 * m * n / (p * (m + n))  # 170.67 rows per replica
    for k in (1, 64, 170, 171, 400):
        sfb, ar = factor_values(k, p, m, n)
        ly, gather = layer_costs(k, p, m, n)
        chosen = choose_layers([SfbLayer("fc", ly.factors, 0.0, ly.saved_s)], gather).layers
        assert bool(chosen) is (k < cross) is (sfb < ar)


def test_a_shared_factor_is_gathered_once():
    # alone neither layer pays (gathering x costs more than either saves); both together do
    a = SfbLayer("a", ("x", "da"), 0.0, 1.0)
    b = SfbLayer("b", ("x", "db"), 0.0, 1.0)
    gather = {"x": 1.5, "da": 0.1, "db": 0.1}
    assert choose_layers([a], gather).layers == ()
    both = choose_layers([a, b], gather)
    assert both.layers == ("a", "b") and both.tensors == ("da", "db", "x")
    assert both.objective == pytest.approx(-0.3)
    assert choose_layers([], {}).layers == ()
    with pytest.raises(ValueError):
        choose_layers([a], {"x": 1.0})


JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "sfb",
       "model": {"catalog": "mlp", "params": {"layers": 4, "hidden": 1024}},
       "batch": {"global": 64}, "sync": {"bucket": "4MB"}, "cost": {"method": "roofline"},
       "strategies": ["baseline", "baseline+sfb"]}


def test_plan_chooses_the_wide_layers_at_a_small_batch():
    doc, _ctx, evals = make_plan(load_cluster(PLANS / "hetero8-cluster.yaml"),
                                 parse_job(JOB), use_cache=False)
    t = {e.strategy.name: e.result.iteration_time for e in evals}
    assert t["baseline+sfb"] < 0.5 * t["baseline"]
    assert doc["metadata"]["strategy"] == "baseline+sfb"
    # 8 rows per replica: the 1024-wide layers (crossover 64 rows) go by SFB, not the
    # 1024 x 10 classifier (crossover 2.5 rows)
    assert doc["job"]["sfb"] == ["net.0", "net.2", "net.4", "net.6"]
    assert "sfb" not in doc["job"]["collective"]
    s = evals[1].strategy
    classifier = 4 * (1024 * 10 + 10)
    assert sum(s.buckets) == classifier  # only the classifier is all-reduced
    assert plan_problems(doc) == []


def test_plan_keeps_the_allreduce_at_a_large_batch():
    job = JOB | {"batch": {"global": 8192}}
    _doc, _ctx, evals = make_plan(load_cluster(PLANS / "hetero8-cluster.yaml"),
                                  parse_job(job), use_cache=False)
    base, sfb = (e.strategy for e in evals)
    assert sfb.collective["sfb"] == [] and sfb.buckets == base.buckets
    assert evals[1].result.iteration_time == pytest.approx(evals[0].result.iteration_time)


def test_cli_plans_and_explains_sfb(tmp_path, capsys):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(JOB | {"strategies": ["baseline+sfb"]}))
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(PLANS / "hetero8-cluster.yaml"), str(job_file), "-o", str(out),
                 "--no-cache"]) == 0
    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    text = capsys.readouterr().out
    assert "sufficient-factor broadcasting: 4 of 5 fully connected layer(s)" in text
    assert "SFB layer net.2: 1024 -> 1024, 8 rows per replica" in text


def test_sfb_on_hosts_with_several_ranks_gathers_inside_the_host(tmp_path):
    """Hosts of 2 ranks (before: refused, "one rank per host only"): the AllReduce and the
    factors' all-gather are hierarchical over the devices, one copy of each rank's factors
    crosses the NICs, and the plan carries the runtime contract beside the SFB layers."""
    from topoctl.spec.cluster_load import parse_cluster

    doc = yaml.safe_load((PLANS / "mesh4-cluster.yaml").read_text())
    doc["defaults"]["gpus"] = {"count": 2, "type": "cpu"}
    job = JOB | {"strategies": ["baseline", "baseline+sfb"]}
    plan, ctx, evals = make_plan(parse_cluster(doc), parse_job(job), use_cache=False)
    s = evals[1].strategy
    assert s.name == "baseline+sfb" and s.collective["hierarchical"] == {"local_size": 2}
    gathers = [t for t in s.tasks if t.id.startswith("sfb")]
    assert gathers and all(g.schedule.name == "hierarchical-allgather" for g in gathers)
    assert set(gathers[0].schedule.members) == {f"h{j}/g{i}" for j in range(4)
                                                for i in range(2)}
    assert plan["metadata"]["strategies"]["baseline+sfb"]["iteration_time"] > 0


def test_ranks_leave_each_gather_one_by_one():
    # gloo's ranks leave a ring all-gather one by one (a rank is done when its own pieces
    # are), and each rebuilds that layer's gradient then (`topotrain.sfb`), while the ranks
    # behind the slow cables still receive: their compute, on the lab's 2 shared cores, runs
    # under the gathers' tail. Every rank rebuilding after the slowest rank's last gather
    # predicted the demo's row (K = 48 on hetero8) 7.9% slow (docs/results.md).
    # compute as slow as the lab's timed ranks (about 4x the roofline's generic CPU)
    job = JOB | {"batch": {"global": 384}, "cost": {"method": "roofline", "scale": 4}}
    ctx = prepare(load_cluster(PLANS / "hetero8-cluster.yaml"), parse_job(job),
                  use_cache=False)
    ctx = replace(ctx, cpu_pool=CpuPool(frozenset(ctx.hosts), 2))  # the lab's 8 ranks
    ev = evaluate(ctx, "baseline+sfb")
    s = ev.strategy
    assert s.collective["sfb"] == ["net.0", "net.2", "net.4", "net.6"]
    gathers = [t for t in s.tasks if isinstance(t, Collective) and t.id.startswith("sfb")]
    assert [t.id for t in gathers] == ["sfb0", "sfb1", "sfb2", "sfb3"]
    assert all(t.member_done for t in gathers)
    alone = simulate(s.tasks, s.network)  # one iteration from idle
    for i, g in enumerate(gathers):
        rebuilt = {h: alone.start[f"rebuild{i}@{h}"] for h in ctx.hosts}
        assert min(rebuilt.values()) < alone.finish[g.id] - 0.01  # ranks leave early
        assert max(rebuilt.values()) == pytest.approx(alone.finish[g.id])
        if i:  # the next gather needs every rank: after the last rank's rebuild
            assert alone.start[g.id] >= max(alone.finish[f"rebuild{i - 1}@{h}"]
                                            for h in ctx.hosts)
    # each rank steps after its last rebuild; the prediction is the steady period
    # (`sim.steady`), never longer than an isolated iteration (with the lab's fixed CPU share
    # per host, `topoctl.lab.cpu`, a rank that leaves a gather early no longer borrows the
    # slow hosts' cores, so the two are equal here; under processor sharing it was shorter)
    assert all(alone.start[f"step@{h}"] >= alone.finish[f"rebuild3@{h}"] for h in ctx.hosts)
    assert ev.result.iteration_time <= alone.iteration_time + 1e-9
