"""Sliced buckets all-reduced by priority within a credit (`topotrain.priority`,
``job.collective.bucket_slicing``), two real gloo ranks on loopback: the averaged gradients
equal DDP's exactly (ring, three iterations, and packed trees, two); the slices' events follow
the plan's priority (no slice sent while a higher-priority one was ready on every rank and
unsent) and show the first layer's slices overtaking queued slices of the large last layer;
with forward overlap, steps of SGD with momentum give the synchronous run's losses and
weights, each bucket applied inside the next forward."""

from __future__ import annotations

import copy
import json
import traceback

import pytest

from tests.integration.test_collectives import random_schedule
from tests.loopback import free_port, spawn_ranks

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from topoctl.catalog.dense import MLP  # noqa: E402
from topotrain.buckets import attach_buckets  # noqa: E402
from topotrain.workload import data_parallel  # noqa: E402

WORLD = 2
# a wide last layer (2048 x 64: 512 KB, 33 slices of 16 KB) ready first in the backward, a small
# first layer (64 x 32) ready last: its slices are ready while the last layer's are queued
KWARGS = {"layers": 2, "hidden": 64, "features": 32, "classes": 2048}
SLICE, CREDIT = 16384, 32768


def _collective(model, algorithm: str, overlap: str = "backward") -> dict:
    """Three buckets in gradient-ready order (last layer first), the first layers' first."""
    names = [n for n, _ in model.named_parameters()][::-1]
    plan = [{"params": names[a:b]} for a, b in ((0, 2), (2, 4), (4, len(names)))]
    return {"algorithm": algorithm, "bucket_plan": plan, "bucket_overlap": overlap,
            "bucket_slicing": {"slice_bytes": SLICE, "priority": [2, 1, 0], "credit": CREDIT}}


def priority_problems(events: list[list], rank: dict[int, int]) -> tuple[list[str], bool]:
    """(problems, whether a slice overtook one ready before it) of one iteration's slice
    events [bucket, slice, bytes, first ready at agreement, sent at agreement, start, end]
    in the order sent: none may be sent while a higher-priority slice was agreed-ready."""
    problems, overtook = [], False
    for i, a in enumerate(events):
        if not a[3] <= a[4]:
            problems.append(f"sent before ready: {a}")
        for b in events[i + 1:]:
            if (rank[b[0]], b[1]) < (rank[a[0]], a[1]) and b[3] <= a[4]:
                problems.append(f"{a} sent although {b} (higher priority) was ready")
            if b[3] < a[3] and rank[a[0]] < rank[b[0]]:
                overtook = True  # a, readied later, went before b
    return problems, overtook


def _sliced_grads(plain, x, algorithm: str, ref: dict, iterations: int) -> list[str]:
    """`iterations` of sliced buckets: gradients equal to DDP's `ref`, events by priority."""
    problems: list[str] = []
    model = copy.deepcopy(plain)
    run = attach_buckets(model, _collective(model, algorithm),
                         schedule=random_schedule(WORLD, 2, seed=1))
    overtook = False
    for it in range(iterations):
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        run.finish()
        events = run.take_slice_events()
        if len(events) != 33 + 2 + 1:  # the buckets of 532480, 16640 and 8448 bytes
            problems.append(f"{algorithm}: {len(events)} slices sent")
        bad, o = priority_problems(events, {2: 0, 1: 1, 0: 2})
        problems += [f"{algorithm} iteration {it}: {p}" for p in bad[:3]]
        overtook |= o
        for name, p in model.named_parameters():
            if not torch.equal(p.grad, ref[name]):
                problems.append(f"{algorithm} {name}: differs from DDP by "
                                f"{(p.grad - ref[name]).abs().max().item()}")
    if algorithm == "ring" and not overtook:
        problems.append("ring: no slice of the first layers overtook a queued one")
    return problems


def _forward_problems(rank: int) -> list[str]:
    """Forward overlap, sliced, against synchronous unsliced buckets: the same losses."""
    out = {}
    for mode in ("sync", "sliced"):
        torch.manual_seed(0)
        model = MLP(**KWARGS)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        coll = _collective(model, "ring", "forward" if mode == "sliced" else "backward")
        if mode == "sync":
            del coll["bucket_slicing"]
        run = attach_buckets(model, coll, optimizer=opt)
        gen, losses, where = torch.Generator().manual_seed(rank), [], []
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = model(torch.randn(4, KWARGS["features"], generator=gen)).pow(2).mean()
            loss.backward()
            run.finish()
            if mode == "sync":
                opt.step()
            where += [e[5] for e in run.take_events() if len(e) > 5]
            losses.append(loss.item())
        run.flush()
        where += [e[5] for e in run.take_events() if len(e) > 5]
        out[mode] = (losses, [p.detach().clone() for p in model.parameters()], where)
    problems = []
    if not torch.allclose(torch.tensor(out["sliced"][0]), torch.tensor(out["sync"][0]),
                          rtol=1e-6, atol=0):
        problems.append(f"forward: losses {out['sliced'][0]} differ from {out['sync'][0]}")
    if not all(torch.allclose(a, b, rtol=1e-6, atol=1e-7)
               for a, b in zip(out["sliced"][1], out["sync"][1], strict=True)):
        problems.append("forward: final weights differ from the synchronous run's")
    if out["sliced"][2] != ["forward"] * 6 + ["flush"] * 3:
        problems.append(f"forward: buckets applied {out['sliced'][2]}")
    return problems


def _ranks(rank: int, port: int, out: str) -> None:
    problems = []
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD)
        torch.manual_seed(0)
        plain = MLP(**KWARGS)
        x = torch.randn(4, KWARGS["features"], generator=torch.Generator().manual_seed(rank))
        ddp = data_parallel(plain, 0.001)  # kept alive: its reducer averages in backward
        ddp(x).pow(2).mean().backward()
        ref = {n: p.grad.clone() for n, p in plain.named_parameters()}
        for algorithm, iterations in (("ring", 3), ("trees", 2)):
            problems += _sliced_grads(plain, x, algorithm, ref, iterations)
        problems += _forward_problems(rank)
    except Exception:  # noqa: BLE001 - reported to the test
        problems.append(traceback.format_exc())
    finally:
        with open(f"{out}.{rank}", "w") as f:
            json.dump(problems, f)
        if dist.is_initialized():
            dist.destroy_process_group()


def test_sliced_buckets_by_priority_equal_ddp(tmp_path):
    out = str(tmp_path / "slices")
    spawn_ranks(_ranks, (free_port(), out), WORLD)
    for r in range(WORLD):
        assert json.loads(open(f"{out}.{r}").read()) == [], f"rank {r}"
