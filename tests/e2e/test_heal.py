"""A cable that fails during training, for real: a 4-host ring lab (its own namespaces, shaped
cables, an sshd per host for the SSH case), the plan applied by the agents, DDP over gloo
between the hosts' training addresses, the cable cut as `topoctl lab cut` does while the ranks
train.

- `topoctl run --heal`: the run re-plans without the cable (trees re-packed on the remaining
  line), applies the new plan to every host and resumes from the last checkpoint; training
  finishes with identical parameters on every rank, the report names the cable, and no host
  routes over it any more (read back with `ip -j`).
- `topoctl run` (over the lab's sshd): exits 1 within seconds of the cut (gloo would wait
  120 s) naming the cable and its peer; nothing is left running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_training import signal_a_run
from tests.netns import ip_json
from topoagent.process.ranks import rank_dir
from topoctl import cli
from topoctl.lab import lab as labmod
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

pytestmark = pytest.mark.netns

HOSTS = ("h0", "h1", "h2", "h3")
CUT_PORT, CUT_CABLE, PEER = "h1:eth0", "h1:eth0--h2:eth1", "h2:eth1"
CLUSTER = {
    "apiVersion": "topoctl/v1", "kind": "Cluster", "name": "hring4",
    "defaults": {"nic_speed": "200mbit", "gpus": {"count": 1, "type": "cpu"}},
    "hosts": [{"name": h, "nics": [{"name": "eth0"}, {"name": "eth1"}]} for h in HOSTS],
    "fabric": {"kind": "direct", "mtu": 9000, "links": [
        {"a": f"h{i}:eth0", "b": f"h{(i + 1) % 4}:eth1", "bandwidth": "200mbit"}
        for i in range(4)]},
}
# ~1.9 M parameters (7.5 MB of gradients): ~0.3 s per iteration on the 200 Mbit/s cables,
# long enough to cut a cable mid-run, short enough for CI
JOB = {
    "apiVersion": "topoctl/v1", "kind": "Job", "name": "mlp-heal",
    "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 1024, "features": 784,
                                           "classes": 10}},
    "batch": {"global": 64}, "parallelism": {"data": True}, "strategies": ["trees"],
    "cost": {"method": "roofline"},
}
ITERATIONS, EVERY = 24, 4


@contextlib.contextmanager
def _lab_up(root: Path, with_ssh: bool, name: str):
    """A lab of CLUSTER named `name` under `root`/labs (as $TOPOCTL_LAB_DIR while it is up), with
    JOB's plan and job files in `root`: yields (lab, plan path, job path), takes the lab down
    whatever happens."""
    cluster = parse_cluster(CLUSTER)
    job = root / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    plan, _, _ = make_plan(cluster, parse_job(JOB), use_cache=False)
    path = root / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOCTL_LAB_DIR", str(root / "labs"))
        lab = labmod.up(cluster, name=name, with_ssh=with_ssh)
        try:
            yield lab, str(path), str(job)
        finally:
            labmod.down(lab.name)


# other suites' labs are t<pid>, demo ones by cluster
def _name(kind: str) -> str:
    return f"{kind}{os.getpid() % 10**6}"


@pytest.fixture
def lab_plan(tmp_path):
    with _lab_up(tmp_path, with_ssh=False, name=_name("hl")) as up:
        yield up


@pytest.fixture
def ssh_lab_plan(tmp_path):
    with _lab_up(tmp_path, with_ssh=True, name=_name("hl")) as up:
        yield up


@pytest.fixture(scope="module")
def shared_ssh_lab_plan(tmp_path_factory):
    """One SSH lab for the signal tests: each applies the plan (in sync after the first) and
    asserts that nothing of its run is left on any host, so the next one finds the lab as the
    first did; a lab and a 4-host apply over SSH less per test. (The cable-cut tests have labs
    of their own: a cut cable stays cut.)"""
    with _lab_up(tmp_path_factory.mktemp("heal-ssh"), with_ssh=True, name=_name("hs")) as up:
        yield up


def cut(lab, port: str) -> float:
    """Cut the cable at `port` as `topoctl lab cut` does (its library call: an interpreter
    started for the CLI would blur the time of the cut); the wall-clock time it was done."""
    assert labmod.set_port(lab, port, False) == [CUT_CABLE]
    return time.time()


def run_in_thread(argv: list[str]) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def go() -> None:
        box["rc"] = cli.main(argv)
        box["end"] = time.time()

    t = threading.Thread(target=go)
    t.start()
    return t, box


def wait_for(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def routes_over(lab, host: str, nic: str) -> list[dict]:
    """Routes of `host` (every table) that leave through `nic`, as `ip -j` reports them."""
    out = []
    for r in ip_json(lab.netns(host), "-4", "route", "show", "table", "all"):
        devs = {r.get("dev")} | {n.get("dev") for n in r.get("nexthops", [])}
        if nic in devs:
            out.append(r)
    return out


def test_heal_resumes_training_around_a_cut_cable(lab_plan, capsys):
    lab, plan, job = lab_plan
    assert cli.main(["apply", plan, "--lab", lab.name]) == 0
    assert routes_over(lab, "h1", "eth0") and routes_over(lab, "h2", "eth1")  # used before
    capsys.readouterr()
    runner, box = run_in_thread(["run", plan, "--lab", lab.name, "--heal", "--job", job,
                                 "--iterations", str(ITERATIONS), "--checkpoint-every",
                                 str(EVERY), "--json", "--timeout", "600"])
    ckpt = rank_dir(lab.state_dir / "agent" / "h1" / "run") / "checkpoints" / f"it-{EVERY}.pt"
    try:
        wait_for(ckpt.exists, 240, f"the checkpoint after iteration {EVERY}")
        cut_at = cut(lab, CUT_PORT)
    finally:
        runner.join(timeout=600)
    assert not runner.is_alive()
    result = json.loads(capsys.readouterr().out)
    assert box["rc"] == 0, result["failure"]
    assert result["synchronous"] is True  # identical parameters on every rank
    [heal] = result["heals"]
    assert heal["cable"] == CUT_CABLE
    assert set(heal["reported_by"]) <= {CUT_PORT, PEER} and heal["reported_by"]
    assert heal["detected_at"] - cut_at < 3.0  # the launchers saw the carrier go at once
    assert heal["resumed_from"] >= EVERY and heal["resumed_from"] % EVERY == 0
    # the iteration count went on from the checkpoint to the end, on every rank
    last = result["ranks"]
    assert all(r["iterations"] == ITERATIONS - heal["resumed_from"] for r in last.values())
    assert result["resumed_from"] == heal["resumed_from"]
    assert heal["predicted_after"] > 0 and heal["measured_after"] > 0
    assert heal["total_s"] is not None and heal["total_s"] < 120
    assert heal["plan_file"] and os.path.exists(heal["plan_file"])
    # every host runs the new plan: no route leaves over the cut cable, its ports unnumbered
    for host, nic in (("h1", "eth0"), ("h2", "eth1")):
        assert routes_over(lab, host, nic) == []
        [link] = ip_json(lab.netns(host), "-4", "addr", "show", "dev", nic) or [{}]
        assert not link.get("addr_info")
    for host in HOSTS:  # checkpoints cleaned up, nothing left running
        assert (lab.state_dir / "agent" / host / "run").is_dir()
        assert not rank_dir(lab.state_dir / "agent" / host / "run").exists()
        assert not (lab.state_dir / "agent" / host / "run" / "job.pids").exists()
    assert cli.main(["status", heal["plan_file"], "--lab", lab.name]) == 0  # in sync


@pytest.mark.serial
def test_without_heal_the_run_stops_within_seconds_naming_the_cable(ssh_lab_plan, capsys):
    lab, plan, _ = ssh_lab_plan
    assert cli.main(["apply", plan, "--lab", lab.name, "--ssh"]) == 0
    capsys.readouterr()
    runner, box = run_in_thread(["run", plan, "--lab", lab.name, "--ssh", "--iterations",
                                 "100000", "--json"])
    pids = [lab.state_dir / "agent" / h / "run" / "job.pids" for h in HOSTS]
    try:
        wait_for(lambda: all(p.exists() for p in pids), 120, "every host's ranks")
        time.sleep(5)  # training under way
        cut_at = cut(lab, CUT_PORT)
    finally:
        runner.join(timeout=300)
    assert not runner.is_alive()
    took = box["end"] - cut_at
    result = json.loads(capsys.readouterr().out)
    assert box["rc"] == 1
    assert took < 15, f"{took:.1f} s from the cut to the exit (gloo alone waits 120 s)"
    first = result["failure"].splitlines()[0]
    assert first.startswith(f"cable {CUT_CABLE} failed: ")
    assert "peer" in first and "training stopped on every host" in first
    assert {d["cable"] for d in result["links_down"]} == {CUT_CABLE}
    assert not any(p.exists() for p in pids)  # nothing left running anywhere


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_over_ssh_ended_by_a_signal_leaves_nothing_behind(shared_ssh_lab_plan, sig):
    """`topoctl run --ssh` killed (-9: nothing of it runs any more; the hosts see their SSH
    connections close) or terminated: no launcher and no rank is left on any host within
    seconds."""
    lab, plan, _ = shared_ssh_lab_plan
    assert cli.main(["apply", plan, "--lab", lab.name, "--ssh"]) == 0
    rc, gone = signal_a_run(lab, plan, sig, ssh=True)
    assert rc == (-9 if sig == signal.SIGKILL else 130) and gone < 10, (rc, gone)
