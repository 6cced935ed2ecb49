"""Checkpoint and resume of `python -m topotrain.train` (what `topoctl run --heal` relies on):
two real ranks over loopback, each with its own run directory as two hosts would have. A run
stopped after iteration 3 (the trainer's test switch) and resumed ends bit-identical to the
run that was never stopped; the ranks agree on the newest checkpoint any of them has and
that rank's state reaches the other; checkpoints are removed at the end."""

from __future__ import annotations

import json
import os

from tests.integration.test_train_ddp import JOB
from tests.loopback import free_port, run_module_ranks

ITERS = 6


def run_ranks(job: dict, tmp_path, extra_env: dict | None = None,
              expect: int = 0) -> list[dict]:
    """Both ranks of `job` as `python -m topotrain.train` (`tests.loopback.run_module_ranks`),
    rank r with run directory tmp_path/h<r>; their events (each rank must exit `expect`)."""
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    port = free_port()
    envs = []
    for r in range(2):
        run_dir = tmp_path / f"h{r}"
        run_dir.mkdir(exist_ok=True)
        envs.append({**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                     "TOPOCTL_JOB": str(path), "TOPOCTL_RUN_DIR": str(run_dir),
                     "GLOO_SOCKET_IFNAME": "lo", "TOPOCTL_BIND_ADDRESS": "127.0.0.1",
                     **(extra_env or {})})
    outs = [tmp_path / f"rank-out-{r}.txt" for r in range(2)]
    codes = run_module_ranks("topotrain.train", envs, outs, timeout=300)
    events = []
    for code, out in zip(codes, outs, strict=True):
        text = out.read_text()
        assert code == expect, text[-3000:]
        events += [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    return events


def checkpoints(tmp_path, r: int) -> list[str]:
    d = tmp_path / f"h{r}" / "checkpoints"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path):
    job = JOB | {"iterations": ITERS}
    # the run never stopped: resuming with no checkpoint anywhere starts from iteration 0, and
    # the checkpoints it writes (after iterations 2 and 4) are gone when it ends
    (tmp_path / "whole").mkdir()
    whole = run_ranks(job | {"checkpoint": {"every": 2, "resume": True}}, tmp_path / "whole")
    assert not [e for e in whole if e["event"] == "resume"]
    assert sorted(e["iter"] for e in whole if e["event"] == "iter") == sorted(
        list(range(ITERS)) * 2)
    assert checkpoints(tmp_path / "whole", 0) == checkpoints(tmp_path / "whole", 1) == []
    want = {e["checksum"] for e in whole if e["event"] == "done"}
    assert len(want) == 1

    ck = job | {"checkpoint": {"every": 2}}
    stopped = run_ranks(ck, tmp_path, {"TOPO_TRAIN_EXIT_AFTER": "3"}, expect=75)
    assert sorted(e["iter"] for e in stopped if e["event"] == "iter") == [0, 0, 1, 1, 2, 2]
    assert checkpoints(tmp_path, 0) == checkpoints(tmp_path, 1) == ["it-2.pt"]
    # rank 0's host lost its checkpoint: rank 1's must be the one every rank resumes from
    (tmp_path / "h0" / "checkpoints" / "it-2.pt").unlink()

    resumed = run_ranks(ck | {"checkpoint": {"every": 2, "resume": True}}, tmp_path)
    assert [e for e in resumed if e["event"] == "resume"] == [
        {"event": "resume", "rank": 0, "iteration": 2, "source": 1}]
    assert sorted(e["iter"] for e in resumed if e["event"] == "iter") == [2, 2, 3, 3, 4, 4, 5, 5]
    got = {e["checksum"] for e in resumed if e["event"] == "done"}
    assert got == want  # bit-identical: same data per (rank, iteration), same reductions
    assert checkpoints(tmp_path, 0) == checkpoints(tmp_path, 1) == []
