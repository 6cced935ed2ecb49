"""Training under a plan, for real: a 4-host lab, the plan applied by the agents, DDP over gloo
between the hosts' training addresses (routed over the shaped fabric), supervised by
`topoctl run`. Every rank must finish with bit-identical parameters; `topoctl run` ended by a
signal leaves no launcher and no rank behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from topoagent.process.pidfile import live, read_pids
from topoagent.protocol import EXIT_INTERRUPTED
from topoctl import cli
from topoctl.lab import lab as labmod
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

pytestmark = pytest.mark.netns

CLUSTER = {
    "apiVersion": "topoctl/v1", "kind": "Cluster", "name": "ring4",
    "defaults": {"nic_speed": "200mbit", "gpus": {"count": 1, "type": "cpu"}},
    "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]} for i in range(4)],
    "fabric": {"kind": "direct", "mtu": 9000, "links": [
        {"a": f"h{i}:eth0", "b": f"h{(i + 1) % 4}:eth1", "bandwidth": "200mbit"}
        for i in range(4)]},
}
JOB = {
    "apiVersion": "topoctl/v1", "kind": "Job", "name": "mlp-small",
    "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 128, "features": 64,
                                           "classes": 10}},
    "batch": {"global": 64}, "parallelism": {"data": True}, "strategies": ["baseline"],
    "cost": {"method": "roofline"},
}


@pytest.fixture
def lab_and_plan(request, tmp_path, monkeypatch):
    """The plan uses the strategy given as the fixture's parameter (default baseline)."""
    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(tmp_path / "labs"))
    cluster = parse_cluster(CLUSTER)
    strategy = getattr(request, "param", "baseline")
    plan, _, _ = make_plan(cluster, parse_job({**JOB, "strategies": [strategy]}),
                           use_cache=False)
    assert plan["metadata"]["strategy"] == strategy
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    name = f"t{os.getpid() % 10**6}"
    lab = labmod.up(cluster, name=name, with_ssh=False)
    try:
        yield lab, str(path)
    finally:
        labmod.down(name)


@pytest.mark.parametrize("lab_and_plan", ["baseline", "trees"], indirect=True)
def test_ddp_over_the_lab_trains_in_lockstep(lab_and_plan, capsys):
    """The ring, and the tree schedule's lock-step runtime as DDP hook: every rank ends with
    bit-identical parameters (`synchronous`)."""
    lab, plan = lab_and_plan
    assert cli.main(["apply", plan, "--lab", lab.name]) == 0
    capsys.readouterr()
    assert cli.main(["run", plan, "--lab", lab.name, "--iterations", "5", "--json",
                     "--timeout", "300"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["synchronous"] is True
    assert sorted(result["ranks"]) == ["0", "1", "2", "3"]
    assert all(r["iterations"] == 5 for r in result["ranks"].values())
    assert {r["host"] for r in result["ranks"].values()} == {"h0", "h1", "h2", "h3"}
    # the tree runtime's time per gradient bucket: all of the gradient, each bucket timed
    doc = yaml.safe_load(open(plan))
    if doc["metadata"]["strategy"] == "trees":
        grad = doc["metadata"]["model"]["parameters_bytes"]
        assert sum(b["bytes"] for b in result["allreduce"]) == grad
        assert all(b["seconds"] > 0 and b["skew"] >= 0 for b in result["allreduce"])
        assert len(result["allreduce"]) == len(doc["job"]["collective"]["buckets"])
    else:
        assert result["allreduce"] is None


def test_a_dying_rank_stops_every_host_and_is_named(lab_and_plan, tmp_path, capsys):
    lab, plan = lab_and_plan
    assert cli.main(["apply", plan, "--lab", lab.name]) == 0
    doc = yaml.safe_load(open(plan))
    # rank 2 alone dies at start (a broken environment) while the others wait for it
    doc["job"]["processes"]["h2"][0]["env"]["RANK"] = "two"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    capsys.readouterr()
    assert cli.main(["run", str(bad), "--lab", lab.name, "--iterations", "3", "--json",
                     "--timeout", "120"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert "rank 2 on h2 exited 1" in result["failure"]
    assert "invalid literal for int()" in result["failure"]
    for h in ("h0", "h1", "h2", "h3"):  # nothing left running anywhere
        assert not (lab.state_dir / "agent" / h / "run" / "job.pids").exists()


def test_stop_ends_a_running_job_on_every_host(lab_and_plan, capsys):
    import threading
    import time

    lab, plan = lab_and_plan
    assert cli.main(["apply", plan, "--lab", lab.name]) == 0
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(cli.main(
        ["run", plan, "--lab", lab.name, "--iterations", "100000", "--json"])))
    runner.start()
    pids = [lab.state_dir / "agent" / h / "run" / "job.pids" for h in ("h0", "h1", "h2", "h3")]
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(p.exists() for p in pids)
    time.sleep(3)  # let training get going
    assert cli.main(["stop", plan, "--lab", lab.name, "--detailed-exitcode"]) == 2
    runner.join(timeout=60)
    # an operator's stop: `run` reports the job stopped, exit 130 (README, exit codes)
    assert not runner.is_alive() and codes == [EXIT_INTERRUPTED]
    assert '"stopped"' in capsys.readouterr().out
    assert not any(p.exists() for p in pids)


def launchers(lab) -> list[int]:
    """The lab's `topo-agent launch` processes (their --state-dir is under the lab's), read from
    /proc."""
    mark = str(lab.state_dir).encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"launch" in argv and any(mark in a for a in argv):
                out.append(int(d.name))
    return out


def signal_a_run(lab, plan: str, sig: int, ssh: bool = False) -> tuple[int, float]:
    """Start `topoctl run` as a process of its own, send it `sig` once every host trains, and
    return its exit code and the seconds until no launcher and no rank of it was left. Its
    stderr goes to a file (a pipe nobody reads could fill and block it); when it does not exit
    in time, SIGABRT makes Python's faulthandler print every thread's stack there, and the
    failure shows it."""
    pidfiles = [lab.state_dir / "agent" / h.name / "run" / "job.pids" for h in lab.cluster.hosts]
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([sys.executable, "-m", "topoctl.cli", "run", plan, "--lab", lab.name,
                              "--iterations", "100000", *(["--ssh"] if ssh else [])],
                             stdout=subprocess.DEVNULL, stderr=err, text=True,
                             env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        try:
            return _signal_and_wait(p, lab, pidfiles, sig)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGABRT)
            p.wait(timeout=30)
            err.seek(0)
            pytest.fail(f"`topoctl run` did not exit within 60 s of {signal.Signals(sig).name}; "
                        f"its stderr:\n{err.read()[-20000:]}")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


def _signal_and_wait(p: subprocess.Popen, lab, pidfiles: list[Path], sig: int
                     ) -> tuple[int, float]:
    """`signal_a_run` once the run is started: wait for every host's ranks, signal, and time
    until nothing of the run is left."""
    deadline = time.monotonic() + 120
    while not all(f.exists() for f in pidfiles) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(f.exists() for f in pidfiles), "the ranks did not start"
    time.sleep(3)  # training under way
    ranks = [entry for f in pidfiles for entry in read_pids(f)]
    assert len(live(ranks)) == len(pidfiles) and launchers(lab)
    p.send_signal(sig)
    t0 = time.monotonic()
    rc = p.wait(timeout=60)
    while (launchers(lab) or live(ranks)) and time.monotonic() < t0 + 60:
        time.sleep(0.1)
    gone = time.monotonic() - t0
    assert not launchers(lab) and not live(ranks)
    assert not any(f.exists() for f in pidfiles)
    return rc, gone


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_run_ended_by_a_signal_leaves_nothing_behind(lab_and_plan, sig):
    """SIGTERM or SIGHUP to `topoctl run`: exit 130, every launcher and rank gone within
    seconds, and the next run starts at once (no `topoctl stop` needed)."""
    lab, plan = lab_and_plan
    assert cli.main(["apply", plan, "--lab", lab.name]) == 0
    rc, gone = signal_a_run(lab, plan, sig)
    assert rc == 130 and gone < 10, (rc, gone)
    if sig == signal.SIGTERM:
        assert cli.main(["run", plan, "--lab", lab.name, "--iterations", "2",
                         "--timeout", "120"]) == 0
