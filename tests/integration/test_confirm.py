"""Confirm-or-revert (`topo-agent apply --confirm-within`): an apply its controller does not
confirm in time is undone by a detached watchdog; a confirmed one stays. Real namespaces, real
agent processes; the host is read back with iproute2 and /proc (tests.netns.host_dump)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.test_agent import Host, dump, full_state, host  # noqa: F401
from tests.integration.test_crash import new_state, run_agent

pytestmark = pytest.mark.netns
WINDOW = "5"  # seconds: short, yet long enough for a loaded CI machine to look in between


def past_deadline(rec: dict) -> None:
    time.sleep(max(0.0, rec["deadline"] - time.time()) + 0.5)


def record(h: Host) -> dict:
    return json.loads((h.state_dir / "confirm.json").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"


def wait_for(cond, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.fixture
def confirm_host(host: Host):  # noqa: F811
    """The `host` fixture, and no watchdog left running after the test."""
    yield host
    try:
        pid = record(host).get("watchdog")
    except (OSError, ValueError):
        return
    if pid and alive(pid):
        os.kill(pid, signal.SIGKILL)


def pending_apply(h: Host) -> tuple[dict, dict]:
    """A first state applied and confirmed, then a second one applied awaiting confirmation
    within `WINDOW`: (the host as after the first, the pending confirmation's record)."""
    assert h.apply(full_state()).returncode == 0
    old = dump(h.ns)
    assert h.apply(new_state(), "--confirm-within", WINDOW, "--no-probe").returncode == 0
    return old, record(h)


def consistent(h: Host, history: int) -> None:
    """No journal left, the lock free (an apply can take it), the history as expected."""
    assert not (h.state_dir / "journal").exists()
    assert len(list((h.state_dir / "history").glob("*.json"))) == history
    r = run_agent(h, "--json", "recover")
    assert r.returncode == 0 and json.loads(r.stdout)["recovered"] is False, r.stdout


@pytest.mark.serial
def test_unconfirmed_apply_reverts_by_itself(confirm_host: Host):
    h = confirm_host
    assert h.apply(full_state()).returncode == 0
    old = dump(h.ns)
    r = h.apply(new_state(), "--confirm-within", WINDOW)
    assert r.returncode == 0, r.stderr
    rec = record(h)
    assert rec["state"] == "pending" and alive(rec["watchdog"])
    assert "topo-agent confirm" in r.stdout
    assert dump(h.ns) != old  # applied for real
    # nobody confirms: the watchdog reverts after the deadline
    assert wait_for(lambda: record(h)["state"] == "reverted"), record(h)
    assert dump(h.ns) == old
    assert wait_for(lambda: not alive(rec["watchdog"]), 5)
    consistent(h, history=2)  # baseline + full_state: the unconfirmed apply left no entry
    late = h.agent("confirm")
    assert late.returncode == 1 and "too late: the apply was reverted" in late.stderr
    assert h.diff(full_state()).returncode == 0  # in sync with the old state
    assert (h.state_dir / "confirm.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.serial
def test_confirmed_apply_stays(confirm_host: Host):
    h = confirm_host
    assert h.apply(full_state()).returncode == 0
    r = h.apply(new_state(), "--confirm-within", WINDOW, "--no-probe")
    assert r.returncode == 0, r.stderr
    new = dump(h.ns)
    pid = record(h)["watchdog"]
    c = h.agent("--json", "confirm", "--no-probe")  # the probe: test_confirm_probe.py
    assert c.returncode == 0 and json.loads(c.stdout)["confirmed"], c.stderr
    assert wait_for(lambda: not alive(pid), 5)  # the watchdog saw it and left
    past_deadline(record(h))
    assert dump(h.ns) == new
    assert record(h)["state"] == "confirmed"
    consistent(h, history=3)
    assert h.diff(new_state()).returncode == 0
    assert h.agent("confirm").returncode == 0  # twice is harmless


def test_one_pending_confirmation_at_a_time_and_rollback_ends_it(confirm_host: Host):
    h = confirm_host
    assert h.apply(full_state()).returncode == 0
    old = dump(h.ns)
    assert h.apply(new_state(), "--confirm-within", "30", "--no-probe").returncode == 0
    pid = record(h)["watchdog"]
    again = h.apply(full_state())
    assert again.returncode == 1 and "awaits confirmation" in again.stderr, again.stderr
    back = h.agent("rollback", "--no-probe")
    assert back.returncode == 0, back.stderr
    assert dump(h.ns) == old
    assert record(h)["state"] == "rolled back"
    assert wait_for(lambda: not alive(pid), 5)
    consistent(h, history=2)


@pytest.mark.serial
def test_a_killed_watchdog_reverts_at_the_next_agent_start(confirm_host: Host):
    h = confirm_host
    old, rec = pending_apply(h)
    os.kill(rec["watchdog"], signal.SIGKILL)
    past_deadline(rec)
    assert dump(h.ns) != old  # nobody reverted yet
    r = h.agent("show")  # any verb: recovery runs first
    assert r.returncode == 0, r.stderr
    assert "reverted an unconfirmed apply" in r.stderr
    assert yaml.safe_load(r.stdout) is not None
    assert dump(h.ns) == old
    assert record(h)["state"] == "reverted"
    consistent(h, history=2)


def _reuse_pid(pid: int, tries: int = 200) -> subprocess.Popen:
    """A bystander process (`sleep`) given the number `pid` once had: the kernel hands out the
    number after /proc/sys/kernel/ns_last_pid next (another fork in between: try again)."""
    last = Path("/proc/sys/kernel/ns_last_pid")
    for _ in range(tries):
        last.write_text(str(pid - 1))
        p = subprocess.Popen(["sleep", "300"])
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    raise AssertionError(f"could not get pid {pid} again")


def test_a_reused_watchdog_pid_does_not_block_the_revert(confirm_host: Host):
    """The watchdog killed and its pid taken by an unrelated process: the record names the
    watchdog by pid and start time, so the next agent start after the deadline reverts (by the
    pid alone the bystander passed for the watchdog and nothing ever reverted)."""
    h = confirm_host
    old, rec = pending_apply(h)
    os.kill(rec["watchdog"], signal.SIGKILL)
    assert wait_for(lambda: not Path(f"/proc/{rec['watchdog']}").exists(), 10)
    bystander = _reuse_pid(rec["watchdog"])
    try:
        past_deadline(rec)
        r = h.agent("show")
        assert r.returncode == 0 and "reverted an unconfirmed apply" in r.stderr, r.stderr
        assert dump(h.ns) == old
        assert record(h)["state"] == "reverted"
        assert bystander.poll() is None  # and the bystander was left alone
    finally:
        bystander.kill()
        bystander.wait()
    consistent(h, history=2)


def test_a_watch_loop_reverts_when_the_watchdog_is_gone(confirm_host: Host):
    """The watchdog killed while a `watch` loop runs with a long interval: the loop wakes at
    the deadline and reverts, with no other agent start."""
    h = confirm_host
    old, rec = pending_apply(h)
    os.kill(rec["watchdog"], signal.SIGKILL)
    loop = subprocess.Popen([sys.executable, "-m", "topoagent.cli", "--netns", h.ns,
                             "--state-dir", str(h.state_dir), "watch", "--interval", "600"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        past_deadline(rec)
        assert wait_for(lambda: record(h)["state"] == "reverted", 20), record(h)
        assert dump(h.ns) == old
    finally:
        loop.send_signal(signal.SIGTERM)
        _, err = loop.communicate(timeout=30)
    assert "Traceback" not in err, err
    consistent(h, history=2)


def test_a_running_launcher_reverts_when_the_watchdog_is_gone(confirm_host: Host):
    """Training runs (a launcher supervising a rank) when the watchdog is killed: the
    launcher, a long-running agent process, notices at the deadline and reverts, with no other
    agent start; the rank keeps running."""
    h = confirm_host
    old, rec = pending_apply(h)
    marker = f"tpt-rank-{os.getpid()}-{time.monotonic_ns()}"
    job = {"name": "t", "command": ["python3", "-c", "import time; time.sleep(120)", marker],
           "world_size": 1, "master": {"address": "127.0.0.1", "port": 29999},
           "batch": {"global": 1, "per_rank": 1}, "model": {},
           "processes": {"h0": [{"rank": 0, "local_rank": 0, "env": {"RANK": "0"}}]}}
    launcher = subprocess.Popen([sys.executable, "-m", "topoagent.cli", "--netns", h.ns,
                                 "--state-dir", str(h.state_dir), "launch", "--host", "h0",
                                 "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    launcher.stdin.write(json.dumps(job))
    launcher.stdin.close()
    try:
        os.kill(rec["watchdog"], signal.SIGKILL)
        past_deadline(rec)
        assert wait_for(lambda: record(h)["state"] == "reverted", 20), record(h)
        assert dump(h.ns) == old
        assert launcher.poll() is None  # training goes on
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)
        err = launcher.stderr.read()
        launcher.stderr.close()
        subprocess.run(["pkill", "-9", "-f", marker], check=False)
    assert "Traceback" not in err, err
    consistent(h, history=2)
