"""Hybrid plans for real: a two-stage pipeline whose stages are replicated, each stage's
replicas synchronising their gradients as the plan's per-stage `sync` says (ring, a parameter
server on a chosen host, none), as separate processes (gloo over loopback); over 20 steps the
losses equal single-process training on the whole batch (fp32 tolerance) and a stage's
replicas end with identical parameters. A bad sync kind stops every rank with the YAML path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from torch import fx

from tests.integration.test_pipeline_runtime import reference_losses, run_local
from tests.loopback import free_port
from topoagent.state.wire import parse_launch_spec
from topoctl.catalog.dense import MLP

ITERS = 20
KWARGS = {"layers": 3, "hidden": 64, "features": 32, "classes": 10}
MICRO, MICROBATCHES = 4, 2


def _ops() -> list[list[str]]:
    names = [n.name for n in fx.symbolic_trace(MLP(**KWARGS)).graph.nodes]
    half = len(names) // 2
    return [names[:half], names[half:]]


def launch(syncs: list[dict | None], replicas: int) -> dict:
    """A launch spec of two stages x `replicas` on hosts s<stage>r<replica>, rank = stage x
    replicas + replica, each stage's `sync` as given (None: no key)."""
    ops = _ops()
    stages, procs = [], {}
    for s, sync in enumerate(syncs):
        hosts = [f"s{s}r{r}" for r in range(replicas)]
        st = {"hosts": hosts, "ranks": [s * replicas + r for r in range(replicas)],
              "ops": ops[s], "send_bytes": 0}
        if sync is not None:
            st["sync"] = sync
        stages.append(st)
    world = 2 * replicas
    for st in stages:
        for h, rank in zip(st["hosts"], st["ranks"], strict=True):
            procs[h] = [{"rank": rank, "local_rank": 0, "env": {
                "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1"}}]
    spec = {"name": "tss", "command": ["python3", "-m", "topotrain.train"],
            "world_size": world, "master": {"address": "127.0.0.1", "port": 29500},
            "iterations": ITERS, "lr": 0.05,
            "batch": {"global": MICRO * MICROBATCHES * replicas, "per_rank": MICRO},
            "model": {"factory": "topoctl.catalog.dense:MLP", "kwargs": KWARGS,
                      "inputs": [{"shape": [KWARGS["features"]], "dtype": "float32"}]},
            "collective": {"algorithm": "pipeline", "schedule": "gpipe",
                           "microbatches": MICROBATCHES, "micro_batch": MICRO,
                           "replicas": replicas, "stages": stages},
            "processes": procs}
    return parse_launch_spec(spec).to_dict(exclude_unset=True)


# two trees over a stage's three replicas (stage ranks 0, 1, 2), a third of the buffer on the
# first: a star rooted at 0 and a chain 0 -> 1 -> 2; small chunks so that both pipeline
TREES3 = {"world_size": 3, "chunk_bytes": 4096, "trees": [
    {"root": 0, "rate": 1.0, "parents": [None, 0, 0]},
    {"root": 2, "rate": 2.0, "parents": [1, 2, None]}]}

# the ring runs in "trees" (stage 1, three replicas) and "mixed" (stage 1, two, by default):
# a case of rings alone would start six more ranks to show nothing new
CASES = {
    "ps": ([{"kind": "ps", "server": "s0r1"}, {"kind": "ps", "server": "s1r2"}], 3),
    # a server on one stage, and no `sync` on the other: a stage without it uses the ring
    "mixed": ([{"kind": "ps", "server": "s0r0"}, None], 2),
    "none": ([{"kind": "none"}, {"kind": "none"}], 1),
    "trees": ([{"kind": "trees", "schedule": TREES3}, {"kind": "ring"}], 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stage_sync_losses_match_single_process(case, tmp_path):
    syncs, replicas = CASES[case]
    job = launch(syncs, replicas)
    events = run_local(job, tmp_path)
    ref = reference_losses(job, MICRO * MICROBATCHES * replicas)
    losses: dict[int, list[float]] = {}
    for e in events:
        if e.get("event") == "iter" and e.get("loss") is not None:
            losses.setdefault(e["iter"], []).append(e["loss"])
    assert sorted(losses) == list(range(ITERS))
    assert ref[0] != pytest.approx(ref[-1], rel=1e-3)  # it trains: the losses move
    for it in range(ITERS):
        assert len(losses[it]) == replicas  # every last-stage replica reports it
        for got in losses[it]:
            assert got == pytest.approx(ref[it], rel=2e-5, abs=1e-6), (case, it)
    starts = {e["rank"]: e["sync"] for e in events if e.get("event") == "start"}
    want = [(s or {"kind": "ring" if replicas > 1 else "none"})["kind"] for s in syncs]
    assert starts == {s * replicas + r: want[s] for s in range(2) for r in range(replicas)}
    sums: dict[int, set] = {}
    for e in events:
        if e.get("event") == "done":
            sums.setdefault(e["stage"], set()).add(e["checksum"])
    assert len(sums) == 2 and all(len(v) == 1 for v in sums.values())


def test_a_bad_sync_kind_stops_the_ranks_naming_the_path(tmp_path):
    job = launch([{"kind": "ring"}, {"kind": "ring"}], 2)
    job["collective"]["stages"][1]["sync"] = {"kind": "gossip"}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, **job["processes"]["s0r0"][0]["env"], "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TOPOCTL_JOB": str(path),
           "GLOO_SOCKET_IFNAME": "lo", "TOPOCTL_BIND_ADDRESS": "127.0.0.1"}
    out = subprocess.run([sys.executable, "-m", "topotrain.train"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "collective.stages[1].sync.kind" in out.stdout + out.stderr
    assert "gossip" in out.stdout + out.stderr
