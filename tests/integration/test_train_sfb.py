"""Sufficient-factor broadcasting in the runtime (`topotrain.sfb`), real gloo ranks on
loopback: the gradients SFB rebuilds from all-gathered factors equal DDP's AllReduce average
(relative 1e-5) on three ranks, and `python -m topotrain.train` with `job.sfb` trains to the
same losses as the plain AllReduce over 20 steps, every rank ending with the same
parameters."""

from __future__ import annotations

import copy
import json
import sys
import traceback

import pytest

from tests.integration.test_pipeline_runtime import run_local, run_ranks
from tests.loopback import free_port, spawn_ranks

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from topoctl.catalog.dense import MLP  # noqa: E402
from topotrain.sfb import attach_sfb  # noqa: E402
from topotrain.workload import data_parallel  # noqa: E402

WORLD = 3
KWARGS = {"layers": 2, "hidden": 48, "features": 20, "classes": 6}
LAYERS = ["net.0", "net.4"]  # the first layer (input needs no gradient) and the last


def _grads(rank: int, port: int, out: str) -> None:
    """One rank: the same batch through DDP alone and through DDP + SFB; the gradients of both
    (and of the SFB model's DDP parameters) written to `out`."""
    problems = []
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD)
        torch.manual_seed(0)
        plain = MLP(**KWARGS)
        sfb_model = copy.deepcopy(plain)
        sfb = attach_sfb(sfb_model, LAYERS)
        ddp_plain, ddp_sfb = data_parallel(plain, 0.01), data_parallel(sfb_model, 0.01)
        # each rank its own 4 rows (SFB gathers equal numbers of rows)
        x = torch.randn(4, KWARGS["features"], generator=torch.Generator().manual_seed(rank))
        ddp_plain(x).pow(2).mean().backward()
        ddp_sfb(x).pow(2).mean().backward()
        sfb.sync()
        for (name, p), q in zip(plain.named_parameters(), sfb_model.parameters(), strict=True):
            err = ((q.grad - p.grad).norm() / p.grad.norm()).item()
            if not err <= 1e-5:
                problems.append(f"{name}: relative error {err}")
    except Exception:  # noqa: BLE001 - reported to the test
        problems.append(traceback.format_exc())
    finally:
        with open(f"{out}.{rank}", "w") as f:
            json.dump(problems, f)
        if dist.is_initialized():
            dist.destroy_process_group()


def test_sfb_gradients_equal_the_allreduce(tmp_path):
    out = str(tmp_path / "grads")
    spawn_ranks(_grads, (free_port(), out), WORLD)
    for r in range(WORLD):
        assert json.loads(open(f"{out}.{r}").read()) == [], f"rank {r}"


JOB = {
    "name": "sfb", "command": [sys.executable, "-m", "topotrain.train"], "world_size": WORLD,
    "master": {"address": "127.0.0.1", "port": 29500}, "iterations": 20, "lr": 0.05,
    "seed": 3, "batch": {"global": 12, "per_rank": 4}, "bucket_cap_mb": 0.01,
    "model": {"factory": "topoctl.catalog.dense:MLP", "kwargs": KWARGS,
              "inputs": [{"shape": [KWARGS["features"]]}]},
    "processes": {f"h{r}": [{"rank": r, "local_rank": 0,
                             "env": {"RANK": str(r), "WORLD_SIZE": str(WORLD)}}]
                  for r in range(WORLD)},
}


def _losses(events: list[dict]) -> list[float]:
    return [e["loss"] for e in sorted((e for e in events if e["event"] == "iter"),
                                      key=lambda e: (e["iter"], e["rank"]))]


def test_sfb_trains_to_the_same_losses(tmp_path, monkeypatch):
    """SFB alone, and SFB with the whole model compiled (`job.fusion`; the runtime attaches the
    SFB layers first, then compiles: their hooks run inside the compiled model)."""
    monkeypatch.setenv("TOPOCTL_INDUCTOR_CACHE", str(tmp_path / "inductor"))
    runs = {}
    for name, extra in (("plain", {}), ("sfb", {"sfb": LAYERS}),
                        ("sfb+fusion", {"sfb": LAYERS, "fusion": {"mode": "whole"}})):
        (tmp_path / name).mkdir()
        runs[name] = run_local(JOB | extra, tmp_path / name)
    want = _losses(runs["plain"])
    assert len(want) == WORLD * 20
    assert want[-1] != pytest.approx(want[0], rel=1e-3)  # it trained: the losses moved
    for name in ("sfb", "sfb+fusion"):
        events = runs[name]
        assert _losses(events) == pytest.approx(want, rel=1e-5, abs=1e-8), name
        done = {e["checksum"] for e in events if e["event"] == "done"}
        assert len(done) == 1, name  # every rank holds the same parameters
        iters = [e for e in events if e["event"] == "iter"]
        assert all(e["sfb_seconds"] > 0 for e in iters), name
    fused = [e for e in runs["sfb+fusion"] if e["event"] == "fusion"]
    assert len(fused) == WORLD and not any(e["fallback"] for e in fused)


def test_a_layer_that_is_not_linear_is_a_clear_error_on_every_rank(tmp_path):
    ranks = run_ranks(JOB | {"sfb": ["net.0", "net.1"]}, tmp_path, timeout=120)  # net.1: ReLU
    path, outs = tmp_path / "job.json", [out for _, out in ranks]
    assert [code for code, _ in ranks] == [1] * WORLD, outs
    for out in outs:
        assert f"{path}: job.sfb[1]: 'net.1' is a ReLU of the model" in out, out
        assert "Traceback" not in out, out


def test_a_planned_sfb_job_trains_as_the_allreduce(tmp_path):
    """The chain: `baseline+sfb` planned on hetero8 at 8 rows per replica names the wide
    layers as the model's modules, and its rendered `job`, run as it is by 8 real ranks,
    trains to the losses of the same job without SFB."""
    from pathlib import Path

    from topoctl.planner import make_plan
    from topoctl.spec.cluster_load import load_cluster
    from topoctl.spec.job import parse_job

    plans = Path(__file__).resolve().parents[2] / "plans"
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "sfb8",
                     "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 1024}},
                     "batch": {"global": 64}, "cost": {"method": "roofline"},
                     "launch": {"iterations": 6}, "strategies": ["baseline+sfb"]})
    plan, _ctx, _ = make_plan(load_cluster(plans / "hetero8-cluster.yaml"), job,
                              use_cache=False)
    spec = plan["job"] | {"lr": 0.05}
    assert spec["sfb"] == ["net.0", "net.2"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    got = _losses(run_local(spec, tmp_path / "a"))
    want = _losses(run_local({k: v for k, v in spec.items() if k != "sfb"}, tmp_path / "b"))
    assert len(got) == 8 * 6
    assert got == pytest.approx(want, rel=1e-5, abs=1e-8)
