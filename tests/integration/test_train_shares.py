"""Batch shares by speed in the runtime (`topotrain.shares`): three gloo ranks on loopback
with unequal shares of the global batch (`job.batch.shares`) train exactly as one process on
the whole batch: over 20 steps the ranks' share-weighted losses equal the single process's
losses, and the even average of the ranks' gradients (what training without the weights
would do) does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.test_pipeline_runtime import run_local

torch = pytest.importorskip("torch")

from topotrain.workload import data_seed, load_factory, random_inputs  # noqa: E402

SHARES = [9, 3, 4]  # a fast host and two slow ones: 16 samples
STEPS = 20
KWARGS = {"layers": 2, "hidden": 32, "features": 16, "classes": 4}
JOB = {
    "name": "shares", "command": [sys.executable, "-m", "topotrain.train"], "world_size": 3,
    "master": {"address": "127.0.0.1", "port": 29500}, "iterations": STEPS, "lr": 0.05,
    "seed": 7, "batch": {"global": 16, "per_rank": 5, "shares": SHARES},
    "bucket_cap_mb": 0.01,
    "model": {"factory": "topoctl.catalog.dense:MLP", "kwargs": KWARGS,
              "inputs": [{"shape": [16]}]},
    "processes": {f"h{r}": [{"rank": r, "local_rank": 0,
                             "env": {"RANK": str(r), "WORLD_SIZE": "3"}}] for r in range(3)},
}


def single_process(weighted: bool, job: dict = JOB) -> list[float]:
    """The losses of one process on the ranks' batches of launch spec `job` concatenated
    (`weighted`: the whole-batch mean; else the even average of the ranks' means, training
    without shares' weights)."""
    shares, seed = job["batch"]["shares"], job.get("seed", 0)
    torch.manual_seed(seed)
    model = load_factory(job["model"]["factory"])(**job["model"]["kwargs"])
    opt = torch.optim.SGD(model.parameters(), lr=job.get("lr", 1e-3))
    gen = torch.Generator()
    losses = []
    for it in range(job["iterations"]):
        parts = []
        for r, n in enumerate(shares):
            gen.manual_seed(data_seed(seed, r, it))
            parts.append(random_inputs(job["model"]["inputs"], n, gen)[0])
        opt.zero_grad()
        if weighted:
            loss = model(torch.cat(parts)).pow(2).mean()
            train = loss
        else:
            means = [model(x).pow(2).mean() for x in parts]
            loss = sum(m * n for m, n in zip(means, shares, strict=True)) / sum(shares)
            train = sum(means) / len(means)
        train.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_shares_train_as_one_process_on_the_whole_batch(tmp_path):
    events = run_local(JOB, tmp_path)
    iters = sorted((e["iter"], e["rank"], e["loss"]) for e in events if e["event"] == "iter")
    assert len(iters) == 3 * STEPS
    got = [sum(SHARES[r] * loss for i, r, loss in iters if i == it) / sum(SHARES)
           for it in range(STEPS)]
    want = single_process(weighted=True)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
    done = [e["checksum"] for e in events if e["event"] == "done"]
    assert len(done) == 3 and len(set(done)) == 1  # the ranks stayed in step
    # the test can fail: without the weights the ranks would have trained another model
    plain = single_process(weighted=False)
    assert max(abs(a - b) / abs(b) for a, b in zip(plain[1:], want[1:], strict=True)) > 1e-3


def test_a_planned_shares_job_trains_as_one_process(tmp_path):
    """The chain: `baseline+shares` planned on a cluster whose hosts differ in speed, its
    rendered `job` run as it is by real ranks, against one process on the whole batch."""
    import yaml

    from topoctl.planner import make_plan
    from topoctl.spec.cluster_load import parse_cluster
    from topoctl.spec.job import parse_job

    plans = Path(__file__).resolve().parents[2] / "plans"
    doc = yaml.safe_load((plans / "fast4-cluster.yaml").read_text())
    for h, speed in zip(doc["hosts"], [2, 1, 1, 0.5], strict=True):
        h["speed"] = speed
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "sh4",
                     "model": {"catalog": "mlp", "params": {"layers": 1, "hidden": 32,
                                                            "features": 16, "classes": 4}},
                     "batch": {"global": 36}, "cost": {"method": "roofline"},
                     "launch": {"iterations": STEPS}, "strategies": ["baseline+shares"]})
    plan, _ctx, _ = make_plan(parse_cluster(doc), job, use_cache=False)
    spec = plan["job"]
    assert spec["batch"]["shares"] == [16, 8, 8, 4]
    events = run_local(spec, tmp_path)
    iters = sorted((e["iter"], e["rank"], e["loss"]) for e in events if e["event"] == "iter")
    shares = spec["batch"]["shares"]
    got = [sum(shares[r] * loss for i, r, loss in iters if i == it) / sum(shares)
           for it in range(STEPS)]
    assert got == pytest.approx(single_process(True, spec), rel=1e-5, abs=1e-7)
