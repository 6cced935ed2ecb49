"""A pipeline over devices, for real: 2 lab hosts with 2 ranks each (`gpus.count: 2`), the
planner's `pipeline` plan as rendered (stages of devices: each stage's ranks with their local
ranks in one host namespace), applied and run by `topoctl run` in the lab. Activations cross
the shaped cable between the hosts' training addresses, a stage's replicas sync over the
host's loopback; the losses equal single-process training on the same batches."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.integration.test_pipeline_runtime import MODELS, cluster_doc, reference_losses
from topoctl import cli
from topoctl.graph.profile import job_graph
from topoctl.lab import lab as labmod
from topoctl.planner import make_plan
from topoctl.rollout.run import job_payload
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

pytestmark = pytest.mark.netns
ITERS = 4


def test_stages_of_devices_train_across_two_lab_hosts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(tmp_path / "labs"))
    model, frac = MODELS["bert"]
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "tpd-bert",
                     "model": model, "batch": {"global": 16},
                     "parallelism": {"data": True, "microbatches": 2},
                     "strategies": ["pipeline"], "cost": {"method": "roofline"}})
    state = 4 * job_graph(job, 16).param_bytes
    # half the model's state per device: the plan needs two stages
    doc = cluster_doc(2, frac * state + 4e6)
    doc["defaults"]["gpus"]["count"] = 2
    cluster = parse_cluster(doc)
    plan, _, _ = make_plan(cluster, job, use_cache=False)
    stages = plan["job"]["collective"]["stages"]
    assert len(stages) >= 2
    # a stage of devices: several ranks of one host (before: refused, gpus.count: 2)
    assert any(len(set(st["hosts"])) < len(st["hosts"]) for st in stages)
    local = {p["rank"]: (h, p["local_rank"]) for h, ps in plan["job"]["processes"].items()
             for p in ps}
    for st in stages:
        assert [local[r][0] for r in st["ranks"]] == st["hosts"]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    name = f"tpd{os.getpid() % 10**5}"
    lab = labmod.up(cluster, name=name, with_ssh=False)
    try:
        assert cli.main(["apply", str(path), "--lab", lab.name]) == 0
        capsys.readouterr()
        assert cli.main(["run", str(path), "--lab", lab.name, "--iterations", str(ITERS),
                         "--json", "--timeout", "600"]) == 0
        result = json.loads(capsys.readouterr().out)
    finally:
        labmod.down(name)
    assert result["synchronous"] is True
    ranks = result["ranks"]
    assert len(ranks) == sum(len(st["ranks"]) for st in stages)
    hosts_of_stage = {s: sorted(r["host"] for r in ranks.values() if r["stage"] == s)
                      for s in range(len(stages))}
    assert hosts_of_stage == {s: sorted(st["hosts"]) for s, st in enumerate(stages)}
    last = [r for r in ranks.values() if r["stage"] == len(stages) - 1]
    assert len(last) == len(stages[-1]["ranks"])
    ref = reference_losses(job_payload(plan, ITERS), 16)
    for r in last:
        assert r["losses"] == pytest.approx(ref, rel=2e-5, abs=1e-6)
