"""`topoctl plan` / `topoctl explain` end to end: valid plans, predictions against the closed
form, the checked-in example plans are current, bad input fails cleanly writing nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from topoagent.state.host import parse_host_state
from topoctl.cli import main
from topoctl.cli.plan import dump_plan
from topoctl.graph.cost import totals
from topoctl.planner import LAB_TIMED_MAX_S, make_plan, prepare
from topoctl.render.plan import validate_plan
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import load_job, parse_job

PLANS = Path(__file__).resolve().parents[2] / "plans"
# (cluster, job) -> checked-in plan; regenerate with TOPOCTL_REGEN_PLANS=1 pytest tests/unit
EXAMPLES = [("switch8", "mlp"), ("hetero8", "mlp"), ("topoopt12", "resnet50"),
            ("leafspine8", "bert")]

JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "tiny",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 256}},
       "batch": {"global": 64}, "sync": {"bucket": "200KB"},
       "cost": {"method": "roofline", "device": "A100"}}


def write(tmp_path: Path, name: str, data: dict) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return str(p)


@pytest.mark.parametrize("cluster,job", EXAMPLES, ids=lambda x: x)
def test_example_plans_are_current_and_valid(cluster, job):
    doc, _, _ = make_plan(load_cluster(PLANS / f"{cluster}-cluster.yaml"),
                          load_job(PLANS / f"{job}-job.yaml"), use_cache=False)
    for h, st in doc["hosts"].items():
        parse_host_state(st, prefix=f"hosts.{h}")
    assert validate_plan(doc) == []
    text = dump_plan(doc)
    out = PLANS / f"{job}-{cluster}-plan.yaml"
    if os.environ.get("TOPOCTL_REGEN_PLANS"):
        out.write_text(text)
    assert out.exists() and out.read_text() == text, \
        f"{out.name} is stale: run TOPOCTL_REGEN_PLANS=1 pytest tests/unit/test_plan.py"


def test_prediction_matches_ring_closed_form_on_a_switch():
    c = load_cluster(PLANS / "switch8-cluster.yaml")
    doc, ctx, evals = make_plan(c, parse_job(JOB), use_cache=False)
    res = evals[0].result
    n, bw = len(ctx.hosts), 100e6 / 8 * (9000 - 52) / (9000 + 38)  # TCP goodput at MTU 9000
    total = sum(doc["job"]["collective"]["buckets"])
    assert total == ctx.graph.param_bytes
    # buckets all-reduce one after another; each ring takes 2(n-1)/n * S_k / B
    assert res.comm_active == pytest.approx(2 * (n - 1) / n * total / bw, rel=1e-6)
    assert res.iteration_time >= doc["metadata"]["bound"]["iteration_time"] * (1 - 1e-6)
    assert doc["metadata"]["prediction"]["iteration_time"] == pytest.approx(
        res.iteration_time, rel=1e-5)


def test_cli_plan_then_explain(tmp_path, capsys):
    job = write(tmp_path, "job.yaml", JOB)
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(PLANS / "hetero8-cluster.yaml"), job, "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["kind"] == "Plan" and set(doc["hosts"]) == {f"h{i}" for i in range(8)}
    assert doc["job"]["world_size"] == 8 and doc["job"]["batch"]["per_rank"] == 8
    p0 = doc["job"]["processes"]["h0"][0]
    assert p0["env"]["MASTER_ADDR"] == doc["metadata"]["addressing"]["training"]["h0"]
    assert p0["bind_address"] == p0["env"]["TOPOCTL_BIND_ADDRESS"]
    # the plan's fabric reads back as the cluster's fabric
    c = load_cluster(PLANS / "hetero8-cluster.yaml")
    assert c.with_fabric(doc["fabric"]).graph().links == c.graph().links
    png = tmp_path / "t.png"
    assert main(["explain", str(out), "--png", str(png)]) == 0
    text = capsys.readouterr().out
    assert "predicted iteration" in text and "host h7" in text
    assert png.stat().st_size > 1000
    assert main(["explain", str(out), "--hosts", "h2,h5"]) == 0
    text = capsys.readouterr().out
    assert "host h2" in text and "host h5" in text and "host h7" not in text
    assert main(["explain", str(out), "--hosts", "h9"]) == 1


def cluster_data(**over) -> dict:
    base = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "c",
            "defaults": {"nic_speed": "100mbit"},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                      for i in range(4)],
            "fabric": {"kind": "direct", "links": [
                {"a": f"h{i}:eth0", "b": f"h{(i + 1) % 4}:eth1"} for i in range(4)]}}
    return base | over


@pytest.mark.parametrize("cluster,job,where", [
    (cluster_data(), JOB | {"model": {"catalog": "resnot"}}, "job.yaml: model.catalog"),
    (cluster_data(), JOB | {"batch": {"global": 6}}, "job.yaml: batch.global"),
    (cluster_data(), JOB | {"hosts": ["h0", "h9"]}, "job.yaml: hosts[1]: no host h9"),
    (cluster_data(), JOB | {"strategies": ["magic"]}, "job.yaml: strategies[0]"),
    (cluster_data(), JOB | {"cost": {"device": "Z100"}}, "job.yaml: cost.device"),
    (cluster_data(fabric={"kind": "direct", "links": [{"a": "h0:eth0", "b": "h1:eth1"}]}),
     JOB, "cluster.yaml: fabric: disconnected"),
    (cluster_data(defaults={"nic_speed": "100mbit", "gpus": {"count": 0}}), JOB,
     "cluster.yaml: hosts: no host has GPUs"),
    (cluster_data(hosts=[{"name": "h0", "gpus": {"count": 0},
                           "nics": [{"name": "eth0"}, {"name": "eth1"}]}]
                  + cluster_data()["hosts"][1:]), JOB | {"hosts": ["h0", "h1"]},
     "job.yaml: hosts[0]: h0 has no GPUs"),
    (cluster_data(defaults={"nic_speed": "100mbit", "gpus": {"type": "Z100"}}),
     JOB | {"cost": {"method": "roofline"}}, "cluster.yaml: hosts[0].gpus.type"),
    (cluster_data(), {"name": "x"}, "job.yaml: model: Field required"),
])
def test_bad_input_names_the_path_and_writes_nothing(tmp_path, capsys, cluster, job, where):
    c = write(tmp_path, "cluster.yaml", cluster)
    j = write(tmp_path, "job.yaml", job)
    out = tmp_path / "plan.yaml"
    assert main(["plan", c, j, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert where in err.replace(str(tmp_path) + "/", ""), err
    assert not out.exists() and list(tmp_path.glob(".plan*")) == []


def test_explain_rejects_an_invalid_plan(tmp_path, capsys):
    p = tmp_path / "plan.yaml"
    doc = {"apiVersion": "topoctl/v1", "kind": "Plan", "metadata": {}, "fabric": {},
           "job": {}, "hosts": {"h3": {"routes": [{"dst": "10.0.0.1/8", "dev": "eth0"}]}}}
    p.write_text(yaml.safe_dump(doc))
    assert main(["explain", str(p)]) == 1
    assert "hosts.h3.routes[0].dst" in capsys.readouterr().err


def test_gpu_types_from_the_cluster_drive_the_roofline():
    data = cluster_data(gpu_types={"Z100": {"peak_flops": 1e15, "memory_bandwidth": 1e13}},
                        defaults={"nic_speed": "100mbit", "gpus": {"type": "Z100"}})
    slow = cluster_data(gpu_types={"Z100": {"peak_flops": 1e12, "memory_bandwidth": 1e11}},
                        defaults={"nic_speed": "100mbit", "gpus": {"type": "Z100"}})
    job = parse_job(JOB | {"cost": {"method": "roofline"}, "batch": {"global": 4096}})
    fast_doc, _, _ = make_plan(parse_cluster(data), job, use_cache=False)
    slow_doc, _, _ = make_plan(parse_cluster(slow), job, use_cache=False)
    assert fast_doc["metadata"]["prediction"]["compute"] < \
        slow_doc["metadata"]["prediction"]["compute"]
    assert fast_doc["metadata"]["prediction"]["cost_model"] == ["roofline:Z100"]
    scaled = parse_job(JOB | {"cost": {"method": "roofline", "scale": 3},
                              "batch": {"global": 4096}})
    scaled_doc, _, _ = make_plan(parse_cluster(slow), scaled, use_cache=False)
    assert scaled_doc["metadata"]["prediction"]["compute"] == pytest.approx(
        3 * slow_doc["metadata"]["prediction"]["compute"], rel=1e-4)


def test_measured_costs_on_cpu_hosts_are_cached(tmp_path, monkeypatch):
    """cost: auto on `cpu` hosts that are not lab ranks (a `cost.device`-free job whose ranks
    are not timed: one host is a GPU, so the cluster is no lab) profiles the model on this CPU
    once, then reads the cache."""
    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    job = parse_job(JOB | {"cost": {"method": "auto"}})
    data = yaml.safe_load((PLANS / "switch8-cluster.yaml").read_text())
    data["defaults"]["gpus"] = {"count": 2, "type": "cpu"}
    data["hosts"][0]["gpus"] = {"count": 2, "type": "V100"}
    c = parse_cluster(data)
    doc, _, _ = make_plan(c, job)
    assert "measured:CPU" in doc["metadata"]["prediction"]["cost_model"]
    assert doc["metadata"]["prediction"]["compute"] > 0
    files = list((tmp_path / "profiles").glob("*.json"))
    assert len(files) == 1
    files[0].write_text(_inflate(files[0].read_text()))
    doc2, _, _ = make_plan(c, job)  # the (edited) cache is used: compute grows
    assert doc2["metadata"]["prediction"]["compute"] > 100 * doc["metadata"]["prediction"][
        "compute"]


def test_lab_ranks_are_timed_on_this_cpu_and_share_its_cores(tmp_path, monkeypatch):
    """Lab hosts (every host a `cpu`, one rank each, no cost.device): whatever cost.method
    says, a rank's ops are timed on this CPU at its batch (cached), the optimiser step too, and
    every data-parallel strategy's network shares the machine's cores among the ranks."""
    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    job = parse_job(JOB | {"cost": {"method": "roofline"},
                           "strategies": ["baseline", "trees", "topoopt", "trees+bandwidth"]})
    c = load_cluster(PLANS / "hetero8-cluster.yaml")
    doc, ctx, evals = make_plan(c, job)
    assert doc["metadata"]["prediction"]["cost_model"] == ["timed:CPU"]
    assert ctx.cpu_pool is not None and ctx.cpu_pool[0] == frozenset(ctx.hosts)
    assert ctx.cpu_pool[1] >= 1
    for e in evals:
        assert e.strategy.network.cpu_pool == ctx.cpu_pool, e.strategy.name
    files = list((tmp_path / "profiles").glob("*.json"))
    assert len(files) == 1  # the training costs at the rank's batch; roofline needs no profile
    timed = json.loads(files[0].read_text())
    assert ctx.step_s == pytest.approx(sum(v[3] for v in timed.values()))
    files[0].write_text(json.dumps({k: [x * 1000 + 1.0 for x in v] for k, v in timed.items()}))
    doc2, _, _ = make_plan(c, job)  # the (edited) cache is used: compute grows
    assert doc2["metadata"]["prediction"]["compute"] > 100 * doc["metadata"]["prediction"][
        "compute"]


def test_lab_ranks_too_big_to_time_keep_the_roofline(tmp_path, monkeypatch):
    """A model whose roofline step is beyond `LAB_TIMED_MAX_S` is not timed (the lab does not
    train it; timing it would take minutes): roofline, no pool, nothing cached."""
    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    job = parse_job(JOB | {"model": {"catalog": "mlp", "params": {"layers": 4, "hidden": 4096}},
                           "cost": {"method": "roofline"}, "batch": {"global": 8 * 8192}})
    c = load_cluster(PLANS / "switch8-cluster.yaml")
    ctx = prepare(c, job)
    fwd, bwd = totals(ctx.host_costs(ctx.hosts[0]))
    assert fwd + bwd > LAB_TIMED_MAX_S
    assert ctx.cpu_pool is None and ctx.step_s is None
    assert not list((tmp_path / "profiles").glob("*.json"))


def _inflate(text: str) -> str:
    data = json.loads(text)
    return json.dumps({k: [v[0] * 1000 + 1.0, v[1]] for k, v in data.items()})


def test_factory_model_and_a_host_subset(tmp_path, monkeypatch):
    """A factory model (import path + input shapes), measured on this CPU; training on a subset
    of the hosts while the others still get addresses and routes (they may forward)."""
    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "fac",
                     "model": {"factory": "tests.unit.test_graph:make_tiny",
                               "kwargs": {"width": 9}, "inputs": [{"shape": [12]}]},
                     "batch": {"global": 12}, "hosts": ["h0", "h4", "h6"]})
    doc, ctx, _ = make_plan(load_cluster(PLANS / "hetero8-cluster.yaml"), job)
    assert ctx.graph.by_name()["fc1"].out_shape == (4, 9)
    assert doc["job"]["collective"]["order"] == ["h0", "h4", "h6"]
    assert set(doc["job"]["processes"]) == {"h0", "h4", "h6"} and len(doc["hosts"]) == 8
    assert doc["metadata"]["prediction"]["cost_model"] == ["timed:CPU"]  # lab ranks
    assert validate_plan(doc) == []
    busiest = doc["metadata"]["prediction"]["busiest_links"]
    assert busiest and all(0 < u <= 1 + 1e-9 for u in busiest.values())


def test_strategy_extras_rates_and_multipath_reach_the_plan(monkeypatch):
    """A strategy's policy rules, per-destination rates and multipath next hops are rendered
    into valid host states (the hooks later strategies use)."""
    from topoctl import strategies
    from topoctl.strategies import baseline

    def fancy(ctx):
        s = baseline.plan(ctx)
        s.name = "fancy"
        s.rates = {("h0", "h1"): 40_000_000}
        s.routes = {("h0", "h4"): [("h1", 1.0), ("h7", 1.0)]}
        s.extra = {"h0": {"rules": [{"priority": 1000, "from": "10.236.0.1/32", "table": 100}],
                          "routes": [{"dst": "10.236.0.5/32", "table": 100, "dev": "eth0"}]}}
        return s

    monkeypatch.setitem(strategies.STRATEGIES, "fancy", fancy)
    job = parse_job(JOB | {"strategies": ["baseline", "fancy"]})
    from topoctl.planner import render

    doc, ctx, evals = make_plan(load_cluster(PLANS / "hetero8-cluster.yaml"), job,
                                use_cache=False)
    assert set(doc["metadata"]["strategies"]) == {"baseline", "fancy"}
    fancy_eval = next(e for e in evals if e.strategy.name == "fancy")
    doc = render(ctx, fancy_eval, evals)
    assert doc["metadata"]["strategy"] == "fancy" and validate_plan(doc) == []
    st = parse_host_state(doc["hosts"]["h0"], prefix="hosts.h0")
    assert st.rules[0].table == 100 and st.rules[0].priority == 1000
    assert {c.rate for q in st.qos for c in q.classes} == {40_000_000}
    r = next(r for r in st.routes if r.dst == "10.236.0.5/32" and r.table == 254)
    assert len(r.nexthops) == 2
    assert any(r.dst == "10.236.0.5/32" and r.table == 100 for r in st.routes)
    assert doc["hosts"]["h1"].get("sysctl", {}).get("ip_forward") is True  # h0->h4 via h1


def ring_cluster(n: int) -> dict:
    """n hosts in a ring of direct cables (two NICs each): the schema allows up to 4,096."""
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"ring{n}",
            "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "cpu"}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                      for i in range(n)],
            "fabric": {"kind": "direct",
                       "links": [{"a": f"h{i}:eth0", "b": f"h{(i + 1) % n}:eth1"}
                                 for i in range(n)]}}


@pytest.mark.serial  # a deadline of seconds (it failed at load 35-40 beside other tests)
def test_a_cluster_beyond_the_scale_limit_is_refused_up_front(tmp_path):
    """A 4,096-host ring used to run the planner for minutes and > 5 GB: now it is refused
    within seconds, exit 1, the limit and the flag named, nothing written."""
    import subprocess
    import sys
    import time

    cluster = write(tmp_path, "ring.yaml", ring_cluster(4096))
    out = tmp_path / "plan.yaml"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "topoctl.cli", "plan", cluster,
                        str(PLANS / "mlp-job.yaml"), "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - t0
    assert r.returncode == 1, r.stderr
    assert took < 30, took
    assert "Traceback" not in r.stderr
    assert f"{cluster}: hosts: 4096 hosts: more than the planner's limit of 1024" in r.stderr
    assert "--max-hosts" in r.stderr
    assert not out.exists()
    # the limit is the flag's: a lower one refuses a small cluster the same way
    small = write(tmp_path, "ring8.yaml", ring_cluster(8))
    assert main(["plan", small, str(PLANS / "mlp-job.yaml"), "-o", str(out),
                 "--max-hosts", "4"]) == 1
    assert main(["plan", small, str(PLANS / "mlp-job.yaml"), "-o", str(out),
                 "--max-hosts", "8"]) == 0
    assert out.exists()


def test_lab_data_parallel_ranks_are_timed_beside_the_others_pipeline_stages_alone(
        monkeypatch):
    """The lab's data-parallel ranks all compute at once: their step is timed beside copies of
    it (the other ranks, up to 4 per core); a pipeline stage alone (how many stages compute at
    once is what the pipeline strategies search)."""
    from topoctl import planner

    calls = []
    monkeypatch.setattr(planner, "measure_train_job",
                        lambda job, batch, **kw: calls.append(kw) or None)
    job = parse_job(JOB | {"cost": {"method": "roofline"}, "strategies": ["baseline"]})
    ctx = planner.prepare(load_cluster(PLANS / "hetero8-cluster.yaml"), job)
    ctx.train_costs(8)
    ctx.train_costs(8, runtime="stage")
    # prepare's own timing (module), then ours: module, stage
    cores = ctx.lab.cores
    assert [c["corun"] for c in calls] == [planner.lab_corun(8, cores)] * 2 + [0]
    assert [c["runtime"] for c in calls] == ["module", "module", "stage"]
    assert 0 < planner.lab_corun(8, cores) <= 7 and planner.lab_corun(1, cores) == 0
    assert planner.lab_corun(8, 1) == 3 and planner.lab_corun(8, 2) == 7  # 4 per core
