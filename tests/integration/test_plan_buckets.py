"""Plan-named gradient buckets in the runtime (`topotrain.buckets`), real gloo ranks on
loopback: the averaged gradients equal DDP's exactly (two ranks, ring and packed trees, a
grouping unlike DDP's), and `python -m topotrain.train` with `job.collective.bucket_plan`
reports the buckets in the plan's order every iteration, every rank ending with the same
parameters; a plan that misses a parameter is refused naming its YAML path. With
``bucket_overlap: forward`` (the AllReduces waited for in the next forward, the optimizer
stepped per bucket there) 20 steps of SGD with momentum and of Adam give the synchronous
run's losses and weights, and a bucket is waited for inside the next forward."""

from __future__ import annotations

import copy
import json
import sys
import time
import traceback

import pytest

from tests.integration.test_collectives import random_schedule
from tests.integration.test_pipeline_runtime import run_local
from tests.loopback import free_port, spawn_ranks

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from topoctl.catalog.dense import MLP  # noqa: E402
from topotrain.buckets import attach_buckets  # noqa: E402
from topotrain.workload import data_parallel  # noqa: E402

WORLD = 2
KWARGS = {"layers": 2, "hidden": 40, "features": 12, "classes": 5}


def _plan(model) -> list[dict]:
    """Three buckets in gradient-ready order (last layer first), of uneven sizes."""
    names = [n for n, _ in model.named_parameters()][::-1]
    cuts = [(0, 1), (1, 4), (4, len(names))]
    return [{"params": names[a:b]} for a, b in cuts]


def _grads(rank: int, port: int, out: str) -> None:
    problems = []
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD)
        torch.manual_seed(0)
        plain = MLP(**KWARGS)
        x = torch.randn(4, KWARGS["features"], generator=torch.Generator().manual_seed(rank))
        ddp = data_parallel(plain, 0.001)  # kept alive: its reducer averages in backward
        ddp(x).pow(2).mean().backward()
        for algorithm in ("ring", "trees"):
            model = copy.deepcopy(plain)
            model.zero_grad(set_to_none=True)
            run = attach_buckets(model, {"algorithm": algorithm, "bucket_plan": _plan(model)},
                                 schedule=random_schedule(WORLD, 2, seed=1))
            where = []
            for _ in range(2):  # twice: the runtime resets between iterations
                model.zero_grad(set_to_none=True)
                model(x).pow(2).mean().backward()
                run.finish()
                order = [e[0] for e in run.take_events()]
                if order != [0, 1, 2]:
                    problems.append(f"{algorithm}: buckets started in order {order}")
                where.append([p.grad.data_ptr() for p in model.parameters()])
            if where[0] != where[1]:  # each bucket's buffer is allocated once, then reused
                problems.append(f"{algorithm}: the averages moved to new buffers")
            for (name, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
                if not torch.equal(p.grad, q.grad):
                    err = (q.grad - p.grad).abs().max().item()
                    problems.append(f"{algorithm} {name}: differs from DDP by {err}")
        problems += _forward_overlap_problems(rank)
    except Exception:  # noqa: BLE001 - reported to the test
        problems.append(traceback.format_exc())
    finally:
        with open(f"{out}.{rank}", "w") as f:
            json.dump(problems, f)
        if dist.is_initialized():
            dist.destroy_process_group()


OPTIMIZERS = {"sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
              "adam": lambda ps: torch.optim.Adam(ps, lr=0.01)}


def _steps(rank: int, overlap: str, make_opt, steps: int = 20):
    """(losses, final weights, events) of `steps` steps on the three buckets, listed in the
    order a forward-overlap plan would (the first layers' bucket 2 before bucket 1)."""
    torch.manual_seed(0)
    model = MLP(**KWARGS)
    plan = _plan(model)
    opt = make_opt(model.parameters())
    run = attach_buckets(model, {"algorithm": "ring", "bucket_plan": [plan[0], plan[2], plan[1]],
                                 "bucket_overlap": overlap}, optimizer=opt)
    gen = torch.Generator().manual_seed(rank)
    losses, events, fwd = [], [], []
    for _ in range(steps):
        x = torch.randn(4, KWARGS["features"], generator=gen)
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = model(x).pow(2).mean()
        fwd.append(time.perf_counter() - t0)
        loss.backward()
        run.finish()
        if overlap == "backward":
            opt.step()
        events.append(run.take_events())
        losses.append(loss.item())
    run.flush()
    return losses, [p.detach().clone() for p in model.parameters()], events, fwd


def _forward_overlap_problems(rank: int) -> list[str]:
    """Forward overlap against the synchronous buckets, per optimizer (module docstring)."""
    problems = []
    for name, make_opt in OPTIMIZERS.items():
        ref_loss, ref_w, _, _ = _steps(rank, "backward", make_opt)
        loss, w, events, fwd = _steps(rank, "forward", make_opt)
        if not torch.allclose(torch.tensor(loss), torch.tensor(ref_loss), rtol=1e-6, atol=0):
            problems.append(f"{name}: losses {loss} differ from the synchronous {ref_loss}")
        if not all(torch.allclose(a, b, rtol=1e-6, atol=1e-7)
                   for a, b in zip(w, ref_w, strict=True)):
            problems.append(f"{name}: final weights differ from the synchronous run's")
        # iteration i's event: iteration i-1's buckets, applied inside forward i, first
        # layers' first (bucket 2: the plan's second)
        for i in range(1, len(events)):
            where = [(e[0], e[5]) for e in events[i]]
            if where != [(1, "forward"), (2, "forward"), (0, "forward")] or not all(
                    0 <= e[6] <= e[7] <= fwd[i] for e in events[i]):
                problems.append(f"{name} iteration {i}: applied {events[i]}, forward {fwd[i]}")
                break
    return problems


def test_bucket_gradients_equal_ddps(tmp_path):
    out = str(tmp_path / "grads")
    spawn_ranks(_grads, (free_port(), out), WORLD)
    for r in range(WORLD):
        assert json.loads(open(f"{out}.{r}").read()) == [], f"rank {r}"


JOB = {
    "name": "buckets", "command": [sys.executable, "-m", "topotrain.train"],
    "world_size": WORLD, "master": {"address": "127.0.0.1", "port": 29500}, "iterations": 4,
    "lr": 0.05, "seed": 3, "batch": {"global": 8, "per_rank": 4}, "bucket_cap_mb": 0.001,
    "model": {"factory": "topoctl.catalog.dense:MLP", "kwargs": KWARGS,
              "inputs": [{"shape": [KWARGS["features"]]}]},
    "collective": {"algorithm": "ring"},
    "processes": {f"h{r}": [{"rank": r, "local_rank": 0,
                             "env": {"RANK": str(r), "WORLD_SIZE": str(WORLD)}}]
                  for r in range(WORLD)},
}


def test_train_runs_the_plans_buckets_in_order(tmp_path):
    torch.manual_seed(0)
    plan = _plan(MLP(**KWARGS))
    job = copy.deepcopy(JOB)
    job["collective"]["bucket_plan"] = plan
    events = run_local(job, tmp_path)
    iters = [e for e in events if e["event"] == "iter"]
    assert len(iters) == WORLD * JOB["iterations"]
    for e in iters:
        assert [b[0] for b in e["buckets"]] == list(range(len(plan))), e["buckets"]
        assert all(b[2] <= b[3] <= b[4] for b in e["buckets"]), e["buckets"]
    # synchronous: every rank ends with the same weights (the gradients are DDP's: above)
    assert len({e["checksum"] for e in events if e["event"] == "done"}) == 1
    # forward overlap through the trainer: the same losses and final weights, the previous
    # iteration's buckets applied in each forward, the last iteration's flushed
    job["collective"]["bucket_overlap"] = "forward"
    (tmp_path / "forward").mkdir()
    fwd = run_local(job, tmp_path / "forward")
    assert ({e["checksum"] for e in fwd if e["event"] == "done"}
            == {e["checksum"] for e in events if e["event"] == "done"})
    assert ([round(e["loss"], 6) for e in fwd if e["event"] == "iter"]
            == [round(e["loss"], 6) for e in iters])
    for e in (e for e in fwd if e["event"] == "iter"):
        where = [b[5] for b in e["buckets"]]
        last = e["iter"] == JOB["iterations"] - 1
        assert where == ["forward"] * len(plan) * (e["iter"] > 0) + ["flush"] * len(plan) * (
            last), e["buckets"]
        # the drain after the last iteration is timed apart from it: every flushed bucket's
        # wait (seconds since the flush began) within `flush_seconds`, none in `seconds`
        assert ("flush_seconds" in e) == last, e
        if last:
            assert all(0 <= b[6] <= b[7] <= e["flush_seconds"] for b in e["buckets"]
                       if b[5] == "flush"), (e["buckets"], e["flush_seconds"])
        assert abs(sum(e["phases"].values()) - e["seconds"]) < 1e-4, e


def test_train_refuses_a_plan_missing_a_parameter(tmp_path):
    job = copy.deepcopy(JOB)
    torch.manual_seed(0)
    job["collective"]["bucket_plan"] = _plan(MLP(**KWARGS))[1:]
    job["world_size"], job["processes"] = 1, {"h0": [{"rank": 0, "local_rank": 0, "env": {
        "RANK": "0", "WORLD_SIZE": "1"}}]}
    with pytest.raises(AssertionError, match=r"bucket_plan: no bucket names the parameters"):
        run_local(job, tmp_path)
