"""The `placement` and `pipeline` strategies through the planner: stages respect memory, the
plan says which host runs which stage and which addresses talk to which, hybrids appear when
there are more hosts than stages, and bad input is a clear error with nothing written."""

from __future__ import annotations

import pytest
import yaml

from topoctl import cli
from topoctl.planner import make_plan
from topoctl.sim.memory import format_gb
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import JobError, parse_job


def cluster_doc(n: int, memory: float) -> dict:
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"ring{n}",
            "defaults": {"nic_speed": "1gbit", "gpus": {"count": 1, "type": "small"}},
            "gpu_types": {"small": {"peak_flops": 1e11, "memory_bandwidth": 1e10,
                                    "memory": memory}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                      for i in range(n)],
            "fabric": {"kind": "direct", "mtu": 9000, "links": [
                {"a": f"h{i}:eth0", "b": f"h{(i + 1) % n}:eth1", "bandwidth": "1gbit"}
                for i in range(n)]}}


JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "mlp-pipe",
       "model": {"catalog": "mlp", "params": {"layers": 6, "hidden": 512, "features": 256,
                                              "classes": 10}},
       "batch": {"global": 64}, "parallelism": {"data": True, "microbatches": 4},
       "cost": {"method": "roofline"}}
PARAMS = 4 * (256 * 512 + 5 * 512 * 512 + 512 * 10)  # bytes of the MLP's weights (approx)


def plan(n: int, memory: float, strategy: str, **job):
    return make_plan(parse_cluster(cluster_doc(n, memory)),
                     parse_job({**JOB, "strategies": [strategy], **job}), use_cache=False)


@pytest.mark.parametrize("strategy", ["placement", "pipeline"])
def test_memory_forces_stages_and_the_plan_names_hosts_and_peers(strategy):
    # each device holds about 40% of the model state: at least three stages
    doc, ctx, evals = plan(4, 0.4 * 4 * PARAMS, strategy)
    coll = doc["job"]["collective"]
    assert coll["algorithm"] == "pipeline" and coll["microbatches"] == 4
    stages = coll["stages"]
    assert len(stages) >= 3
    ops = [op for s in stages for op in s["ops"]]
    assert sorted(ops) == sorted(o.name for o in ctx.graph.ops)  # every op placed once
    by = ctx.graph.by_name()
    for s in stages:
        state = 4 * sum(by[o].param_bytes for o in s["ops"])
        assert state <= 0.4 * 4 * PARAMS
        assert s["addresses"] == [doc["metadata"]["addressing"]["training"][h]
                                  for h in s["hosts"]]
    assert len(coll["peers"]) == (len(stages) - 1) * len(stages[0]["hosts"])
    assert coll["peers"][0]["from"] == stages[0]["addresses"][0]
    assert coll["peers"][0]["to"] == stages[1]["addresses"][0]
    assert coll["peers"][0]["bytes_per_microbatch"] > 0
    notes = doc["metadata"]["collective"]
    assert notes["coarsening"]["ops_after"] <= notes["coarsening"]["ops_before"]


def test_hybrid_stages_are_data_parallel_over_host_groups():
    # 8 hosts, the model needs two stages: the fastest candidate replicates them
    doc, _, _ = plan(8, 0.7 * 4 * PARAMS, "placement")
    coll = doc["job"]["collective"]
    cands = doc["metadata"]["collective"]["candidates"]
    assert set(cands) >= {"8x1", "4x2", "2x4"}
    assert coll["replicas"] == len(coll["stages"][0]["hosts"])
    assert coll["replicas"] * len(coll["stages"]) <= 8
    assert doc["metadata"]["prediction"]["iteration_time"] == pytest.approx(
        min(cands.values()), rel=1e-5)


def test_placement_is_compared_with_data_parallel_by_the_planner():
    # devices that hold the whole model (its state is 4 x PARAMS) and its activations
    doc, _, evals = plan(4, 2 * 4 * PARAMS, "placement",
                         strategies=["baseline", "placement", "pipeline"])
    names = {e.strategy.name for e in evals}
    assert names == {"baseline", "placement", "pipeline"}
    assert set(doc["metadata"]["strategies"]) == names
    best = min(evals, key=lambda e: e.result.iteration_time).strategy.name
    assert doc["metadata"]["strategy"] == best


def test_data_parallel_that_does_not_fit_is_refused_beside_the_pipelines():
    # devices of 0.4 x the model's state: the pipelines split it, a replica cannot hold it
    # (the planner used to plan baseline here all the same)
    doc, _, evals = plan(4, 0.4 * 4 * PARAMS, "placement",
                         strategies=["baseline", "placement", "pipeline"])
    assert {e.strategy.name for e in evals} == {"placement", "pipeline"}
    refused = doc["metadata"]["refused"]["baseline"]
    assert refused.startswith("baseline: does not fit in device memory: h0..h3 (4 x small, "
                              f"{format_gb(0.4 * 4 * PARAMS)} each): needs ")
    for g in doc["metadata"]["layout"]["groups"]:  # the plan chosen fits
        assert g["memory"]["total"] <= g["memory"]["capacity"]


def test_a_model_that_fits_nowhere_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(JobError, match="more than any device has"):
        plan(4, 1e5, "placement")
    # through the CLI: exit non-zero, one line naming the file, nothing written
    c, j, out = tmp_path / "c.yaml", tmp_path / "j.yaml", tmp_path / "plan.yaml"
    c.write_text(yaml.safe_dump(cluster_doc(4, 1e5)))
    j.write_text(yaml.safe_dump({**JOB, "strategies": ["placement"]}))
    assert cli.main(["plan", str(c), str(j), "-o", str(out)]) != 0
    err = capsys.readouterr().err
    assert "j.yaml: model:" in err and "Traceback" not in err
    assert not out.exists()


def test_too_few_devices_for_the_memory_names_the_minimum():
    with pytest.raises(JobError, match=r"at least \d+ devices, the job has 2"):
        plan(2, 0.3 * 4 * PARAMS, "placement")
    with pytest.raises(JobError, match="at least 2 hosts"):
        plan(2, 1e12, "placement", hosts=["h0"])


def test_untraceable_model_names_the_op(readable_tmp, monkeypatch):
    # readable_tmp: `topoctl plan` imports the factory as the unprivileged capture user
    mod = readable_tmp / "tpp_untraceable.py"
    mod.write_text(
        "import torch\nfrom torch import nn\n"
        "class Gate(nn.Module):\n"
        "    def __init__(self):\n        super().__init__(); self.l = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        y = self.l(x)\n"
        "        return y if y.sum() > 0 else -y\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n        super().__init__(); self.a = nn.Linear(8, 8); "
        "self.gate = Gate()\n"
        "    def forward(self, x):\n        return self.gate(self.a(x))\n"
        "def build():\n    return Net()\n")
    monkeypatch.syspath_prepend(str(readable_tmp))
    job = {k: v for k, v in JOB.items() if k != "model"} | {
        "model": {"factory": "tpp_untraceable:build", "inputs": [{"shape": [8]}]}}
    with pytest.raises(JobError) as e:
        make_plan(parse_cluster(cluster_doc(2, 1e12)),
                  parse_job({**job, "strategies": ["placement"]}), use_cache=False)
    msg = str(e.value)
    assert "cannot trace" in msg and "gate (Gate)" in msg and "after op gt" in msg


@pytest.mark.parametrize("method", ["auto", "milp"])
def test_the_coarse_search_plans_the_same_stages_twice(method):
    par = {"data": True, "microbatches": 4, "search": method}
    runs = [plan(4, 0.4 * 4 * PARAMS, "placement", parallelism=par)[0] for _ in range(2)]
    stages = [[s["ops"] for s in d["job"]["collective"]["stages"]] for d in runs]
    assert stages[0] == stages[1] and len(stages[0]) >= 3  # memory still forces the split
    assert runs[0]["metadata"]["prediction"] == runs[1]["metadata"]["prediction"]


def test_the_launch_holds_only_the_stage_ranks_renumbered_in_stage_host_order():
    # 5 hosts, at most four stages fit: the fifth host runs nothing and gets no process
    doc, _, _ = plan(5, 0.7 * 4 * PARAMS, "placement", batch={"global": 40})
    job = doc["job"]
    stages = job["collective"]["stages"]
    staged = [h for h in doc["hosts"] if any(h in s["hosts"] for s in stages)]
    assert len(staged) < 5 and sorted(job["processes"]) == sorted(staged)
    procs = [p for h in staged for p in job["processes"][h]]
    assert [p["rank"] for p in procs] == list(range(len(procs))) == sorted(
        r for s in stages for r in s["ranks"])
    assert job["world_size"] == len(procs)
    assert {p["env"]["WORLD_SIZE"] for p in procs} == {str(len(procs))}
    rank0 = next(h for h in staged if job["processes"][h][0]["rank"] == 0)
    assert job["master"]["address"] == doc["metadata"]["addressing"]["training"][rank0]
    for s in stages:  # a stage's ranks are the processes of its hosts
        assert [job["processes"][h][0]["rank"] for h in s["hosts"]] == s["ranks"]
