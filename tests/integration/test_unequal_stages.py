"""Stages with unequal replica counts, for real: a three-stage pipeline whose stages run on 2,
1 and 2 replicas (the last splitting each micro-batch 3 / 5), as separate gloo processes over
loopback. The activations are split and gathered by rows between the stages and their
gradients come back the same way; over 20 steps the losses equal single-process training on
the whole batch (fp32 tolerance), and each stage's replicas end with identical parameters."""

from __future__ import annotations

import pytest
from torch import fx

from tests.integration.test_pipeline_runtime import reference_losses, run_local
from topoagent.state.wire import parse_launch_spec
from topoctl.catalog.dense import MLP

ITERS = 20
KWARGS = {"layers": 3, "hidden": 64, "features": 32, "classes": 10}
MICRO, MICROBATCHES = 4, 2  # 8 rows per micro-batch: 4 + 4, 8, 3 + 5


def launch() -> dict:
    """2 replicas (ring, 4 rows each) -> 1 replica (8 rows) -> 2 replicas (ps, 3 and 5 rows)."""
    names = [n.name for n in fx.symbolic_trace(MLP(**KWARGS)).graph.nodes]
    ops = [names[:3], names[3:6], names[6:]]
    stages = [
        {"hosts": ["a0", "a1"], "ranks": [0, 1], "ops": ops[0], "sync": {"kind": "ring"}},
        {"hosts": ["b0"], "ranks": [2], "ops": ops[1], "shares": [8]},
        {"hosts": ["c0", "c1"], "ranks": [3, 4], "ops": ops[2], "shares": [3, 5],
         "sync": {"kind": "ps", "server": "c1"}}]
    procs = {h: [{"rank": rk, "local_rank": 0, "env": {
        "RANK": str(rk), "WORLD_SIZE": "5", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}}]
        for st in stages for h, rk in zip(st["hosts"], st["ranks"], strict=True)}
    spec = {"name": "tus", "command": ["python3", "-m", "topotrain.train"], "world_size": 5,
            "master": {"address": "127.0.0.1", "port": 29500}, "iterations": ITERS,
            "lr": 0.05, "batch": {"global": 2 * MICRO * MICROBATCHES, "per_rank": MICRO},
            "model": {"factory": "topoctl.catalog.dense:MLP", "kwargs": KWARGS,
                      "inputs": [{"shape": [KWARGS["features"]], "dtype": "float32"}]},
            "collective": {"algorithm": "pipeline", "schedule": "gpipe",
                           "microbatches": MICROBATCHES, "micro_batch": MICRO,
                           "replicas": 2, "stages": stages},
            "processes": procs}
    return parse_launch_spec(spec).to_dict(exclude_unset=True)


def test_unequal_replica_counts_train_as_one_process(tmp_path):
    job = launch()
    events = run_local(job, tmp_path)
    ref = reference_losses(job, 2 * MICRO * MICROBATCHES)
    assert ref[0] != pytest.approx(ref[-1], rel=1e-3)  # it trains: the losses move
    losses: dict[int, list[float]] = {}
    for e in events:
        if e.get("event") == "iter" and e.get("loss") is not None:
            losses.setdefault(e["iter"], []).append(e["loss"])
    assert sorted(losses) == list(range(ITERS))
    for it in range(ITERS):
        assert len(losses[it]) == 2  # both last-stage replicas report the batch's loss
        for got in losses[it]:
            assert got == pytest.approx(ref[it], rel=2e-5, abs=1e-6), it
    rows = {e["rank"]: e["rows"] for e in events if e.get("event") == "start"}
    assert rows == {0: 4, 1: 4, 2: 8, 3: 3, 4: 5}
    sums: dict[int, set] = {}
    for e in events:
        if e.get("event") == "done":
            sums.setdefault(e["stage"], set()).add(e["checksum"])
    assert sorted(sums) == [0, 1, 2] and all(len(v) == 1 for v in sums.values())
