"""`python -m topotrain.train`, DDP path, reads the plan's launch spec as the typed `LaunchSpec`:
two ranks over loopback train a small model with the gloo ring and with a tree schedule, end
with the same parameters (the tree runtime reports its buckets' timings); a launch spec that
is not valid is refused with the file and YAML path, exit 1, before any process group
starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.test_pipeline_runtime import run_local, run_ranks
from tests.loopback import free_port, run_module_ranks

JOB = {
    "name": "tiny", "command": [sys.executable, "-m", "topotrain.train"], "world_size": 2,
    "master": {"address": "127.0.0.1", "port": 29500}, "iterations": 3,
    "batch": {"global": 8, "per_rank": 4}, "bucket_cap_mb": 0.01,
    "model": {"factory": "topoctl.catalog.dense:MLP",
              "kwargs": {"layers": 2, "hidden": 32, "features": 16, "classes": 4},
              "inputs": [{"shape": [16]}]},
    "processes": {f"h{r}": [{"rank": r, "local_rank": 0,
                             "env": {"RANK": str(r), "WORLD_SIZE": "2"}}] for r in range(2)},
}
TREES = {"algorithm": "trees", "schedule": {
    "world_size": 2, "chunk_bytes": 256,
    "trees": [{"root": 0, "rate": 1.0, "parents": [None, 0]},
              {"root": 1, "rate": 1.0, "parents": [1, None]}]}}


@pytest.mark.parametrize("collective", [{}, TREES], ids=["gloo", "trees"])
def test_two_ranks_train_to_the_same_parameters(collective, tmp_path):
    events = run_local(JOB | {"collective": collective}, tmp_path)
    done = [e for e in events if e["event"] == "done"]
    iters = [e for e in events if e["event"] == "iter"]
    assert len(done) == 2 and len(iters) == 2 * JOB["iterations"]
    # each iteration reports its process's CPU: some, and no more than its wall time allows
    # for the process's threads on this machine's cores
    assert all(0 < e["cpu_seconds"] <= e["seconds"] * (os.cpu_count() or 1) + 0.05
               for e in iters)
    # and its own timeline: forward, backward (AllReduces inside), step, adding up to it
    for e in iters:
        ph = e["phases"]
        assert set(ph) == {"forward", "backward", "step"} and min(ph.values()) >= 0
        assert sum(ph.values()) == pytest.approx(e["seconds"], abs=1e-5)
        # and the main thread's CPU in each (the model's compute): some in the forward and
        # backward, never more than the phase's wall time
        cpu = e["phases_cpu"]
        assert set(cpu) == set(ph) and cpu["forward"] > 0 and cpu["backward"] > 0
        assert all(0 <= cpu[k] <= ph[k] + 2e-3 for k in ph)
    assert done[0]["checksum"] == done[1]["checksum"]
    start = next(e for e in events if e["event"] == "start")
    assert start["algorithm"] == (collective.get("algorithm") or "default")
    if not collective:
        assert all("allreduce" not in e for e in iters)
        return
    # the tree runtime reports every gradient bucket of every iteration: all the gradient's
    # bytes, some time waiting for the runtime's thread and some reducing
    from topoctl.catalog.dense import MLP

    grad = sum(p.numel() * 4 for p in MLP(**JOB["model"]["kwargs"]).parameters())
    for e in iters:
        assert len(e["allreduce"]) >= 1
        assert sum(b for b, _, _ in e["allreduce"]) == grad
        assert all(w >= 0 and r > 0 for _, w, r in e["allreduce"])


def test_a_bad_launch_spec_is_refused_naming_file_and_path(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(JOB | {"iterations": 0}))
    env = {**os.environ, "TOPOCTL_JOB": str(path), "RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    p = subprocess.run([sys.executable, "-m", "topotrain.train"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert str(path) in p.stderr and "iterations" in p.stderr
    assert "Traceback" not in p.stderr


def rank_seeded_mlp(**kwargs):
    """A model factory that is not deterministic for a seed: each rank draws other weights."""
    import torch  # noqa: PLC0415 (imported by the ranks only, not at collection)

    from topoctl.catalog.dense import MLP  # noqa: PLC0415 (as above)

    torch.manual_seed(int(os.environ["RANK"]))
    return MLP(**kwargs)


def test_ranks_that_build_other_weights_are_refused_before_training(tmp_path):
    """DDP does not broadcast the weights at start (`topotrain.workload.data_parallel`): the
    ranks compare checksums instead, and a factory that is not deterministic for a seed stops
    the job before its first iteration, naming the ranks."""
    job = JOB | {"model": JOB["model"] | {
        "factory": "tests.integration.test_train_ddp:rank_seeded_mlp"}}
    ranks = run_ranks(job, tmp_path, timeout=120)
    outs = [out for _, out in ranks]
    assert all(code != 0 for code, _ in ranks)
    assert all("built other initial weights" in out for out in outs), outs
    assert not any('"event": "iter"' in out for out in outs)


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root (CAP_SYS_NICE)")
def test_ranks_leave_while_gloo_workers_still_hold_the_last_allreduce(tmp_path):
    """The ranks' main threads outrank their gloo workers on one CPU each
    (`tests.integration.gloo_starved_rank`), so each worker still holds the backward's last
    AllReduce when its main thread ends: the ranks exit 0 all the same, and promptly. Before
    `topotrain.lifetime`, DDP's reducer destroyed the process group at the end of `main()`
    with the GIL held, and every rank hung there after `done`."""
    path = tmp_path / "job.json"
    path.write_text(json.dumps(JOB))
    port = free_port()
    cpus = sorted(os.sched_getaffinity(0))
    envs = [{**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "TOPOCTL_JOB": str(path), "GLOO_SOCKET_IFNAME": "lo",
             "TOPOCTL_BIND_ADDRESS": "127.0.0.1", "STARVE_CPU": str(cpus[r % len(cpus)])}
            for r in range(2)]
    outs = [tmp_path / f"rank-out-{r}.txt" for r in range(2)]
    codes = run_module_ranks("tests.integration.gloo_starved_rank", envs, outs, timeout=120)
    texts = [o.read_text() for o in outs]
    assert all('"event": "done"' in t for t in texts), texts  # they trained to the end
    assert codes == [0, 0], [t[-2000:] for t in texts]
