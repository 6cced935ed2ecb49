"""Pipeline training for real on this machine: a plan's stages as separate processes (gloo over
loopback, point-to-point activations and gradients, group AllReduce for hybrid stages); the
losses equal single-process training of the same model on the same batches (fp32
tolerance)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.loopback import free_port, run_module_ranks
from topoctl.planner import make_plan
from topoctl.rollout.run import job_payload
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job
from topotrain.pipeline import batch_inputs
from topotrain.train import load_factory

ITERS = 3


def cluster_doc(n: int, memory: float) -> dict:
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"tpp{n}",
            "defaults": {"nic_speed": "1gbit", "gpus": {"count": 1, "type": "small"}},
            "gpu_types": {"small": {"peak_flops": 1e11, "memory_bandwidth": 1e10,
                                    "memory": memory}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                      for i in range(n)],
            "fabric": {"kind": "direct", "mtu": 9000, "links": [
                {"a": f"h{i}:eth0", "b": f"h{(i + 1) % n}:eth1", "bandwidth": "1gbit"}
                for i in range(n)]}}


MODELS = {
    "bert": ({"catalog": "bert", "params": {"layers": 2, "hidden": 32, "heads": 4, "seq": 8,
                                            "vocab": 50}}, 0.5),
    "vgg": ({"catalog": "vgg", "params": {"depth": 11, "width": 4, "image": 32, "hidden": 32,
                                          "classes": 10}}, 0.45),
}


def reference_losses(job: dict, global_batch: int) -> list[float]:
    spec = job["model"]
    torch.manual_seed(0)
    model = load_factory(spec["factory"])(**spec["kwargs"])
    opt = torch.optim.SGD(model.parameters(), lr=float(job.get("lr", 1e-3)))
    out = []
    for it in range(int(job.get("iterations", ITERS))):
        x = batch_inputs(spec["inputs"], global_batch, it, 0)
        opt.zero_grad()
        loss = model(*x).float().pow(2).mean()
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def run_ranks(job: dict, tmp_path, timeout: float = 300) -> list[tuple[int, str]]:
    """Every rank of the launch spec `job` on loopback, as `python -m topotrain.train`
    (`tests.loopback.run_module_ranks`): (exit code, stdout and stderr) per rank, in the
    spec's order; every rank killed if one outlives `timeout`."""
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    port = free_port()
    envs = [{**os.environ, **spec["env"], "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "TOPOCTL_JOB": str(path), "GLOO_SOCKET_IFNAME": "lo",
             "TOPOCTL_BIND_ADDRESS": "127.0.0.1"}
            for specs in job["processes"].values() for spec in specs]
    outs = [tmp_path / f"rank-out-{i}.txt" for i in range(len(envs))]
    codes = run_module_ranks("topotrain.train", envs, outs, timeout)
    return [(-1 if c is None else c, o.read_text()) for c, o in zip(codes, outs, strict=True)]


def run_local(job: dict, tmp_path) -> list[dict]:
    """The events of every rank of a run that must succeed (each rank exits 0)."""
    events = []
    for code, out in run_ranks(job, tmp_path):
        assert code == 0, out[-3000:]
        events += [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return events


@pytest.mark.parametrize("name,hosts", [("bert", 4), ("vgg", 4), ("bert", 8)])
def test_pipeline_losses_match_single_process(name, hosts, tmp_path):
    model, frac = MODELS[name]
    job_doc = {"apiVersion": "topoctl/v1", "kind": "Job", "name": f"tpp-{name}",
               "model": model, "batch": {"global": 16},
               "parallelism": {"data": True, "microbatches": 2},
               "strategies": ["placement"], "cost": {"method": "roofline"}}
    job = parse_job(job_doc)
    # memory: a fraction of the model's state per device, so the plan needs several stages
    from topoctl.graph.profile import job_graph

    state = 4 * job_graph(job, 16).param_bytes
    cluster = parse_cluster(cluster_doc(hosts, frac * state + 4e6))
    plan, _, _ = make_plan(cluster, job, use_cache=False)
    coll = plan["job"]["collective"]
    assert coll["algorithm"] == "pipeline" and len(coll["stages"]) >= 2
    payload = job_payload(plan, ITERS)
    events = run_local(payload, tmp_path)
    losses = {}
    for e in events:
        if e.get("event") == "iter" and e.get("loss") is not None:
            losses.setdefault(e["iter"], set()).add(round(e["loss"], 6))
    ref = reference_losses(payload, 16)
    assert sorted(losses) == list(range(ITERS))
    for it in range(ITERS):
        for got in losses[it]:
            assert got == pytest.approx(ref[it], rel=2e-5, abs=1e-6)
    # replicas of a stage end with identical parameters
    sums: dict[int, set] = {}
    for e in events:
        if e.get("event") == "done" and e["stage"] >= 0:  # < 0: a host left without a stage
            sums.setdefault(e["stage"], set()).add(e["checksum"])
    assert len(sums) == len(coll["stages"]) and all(len(v) == 1 for v in sums.values())
