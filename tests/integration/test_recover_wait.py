"""`topo-agent recover --wait`: what topoctl asks over a new connection when an SSH session
dropped under an apply. While another agent holds the host's lock (its apply still running) the
journal is live and must not be replayed; `--wait` waits for the lock, then recovers. Real
namespaces and agent processes; the host read back with iproute2 and /proc."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tests.integration.test_agent import Host, dump, full_state, host  # noqa: F401
from tests.integration.test_crash import new_state, run_agent
from topoagent.apply.store import host_lock_path
from topoagent.target import Target

pytestmark = pytest.mark.netns


class _HeldLock(threading.Thread):
    """The host's lock held from another thread, as a running apply does: for `seconds`, or
    until `release()` (then the holder outlives the agent call however slow its start-up is on
    a loaded machine)."""

    def __init__(self, h: Host, seconds: float):
        super().__init__()
        self.path, self.seconds = host_lock_path(Target(netns=h.ns)), seconds
        self.taken, self.released = threading.Event(), threading.Event()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)

    def run(self) -> None:
        with open(self.path, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            self.taken.set()
            self.released.wait(self.seconds)

    def release(self) -> None:
        self.released.set()
        self.join()


def _held_lock(h: Host, seconds: float) -> _HeldLock:
    t = _HeldLock(h, seconds)
    t.start()
    assert t.taken.wait(5)
    return t


def test_recover_waits_for_the_running_apply_then_replays_its_journal(host: Host):  # noqa: F811
    h = host
    assert h.apply(full_state()).returncode == 0
    old = dump(h.ns)
    killed = run_agent(h, "apply", "-", stdin=yaml.safe_dump(new_state()),
                       env={"TOPO_AGENT_CRASH_AFTER": "4"})
    assert killed.returncode == -9
    assert (h.state_dir / "journal").exists() and dump(h.ns) != old

    holder = _held_lock(h, 120)
    try:
        busy = run_agent(h, "--json", "recover")  # no wait: a live journal is left alone
        assert busy.returncode == 0 and json.loads(busy.stdout)["recovered"] is False
        assert (h.state_dir / "journal").exists()
        proc = subprocess.Popen([sys.executable, "-m", "topoagent.cli", "--netns", h.ns,
                                 "--state-dir", str(h.state_dir), "--json", "recover",
                                 "--wait", "20", "--detailed-exitcode"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # the apply holding the lock goes on a while
    finally:
        holder.release()
    out, err = proc.communicate(timeout=60)
    waited = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert waited.returncode == 2, waited.stderr
    # recovered: it waited for the lock (without waiting a live journal is left alone, above)
    assert json.loads(waited.stdout)["recovered"] is True
    assert not (h.state_dir / "journal").exists()
    assert dump(h.ns) == old


def test_recover_wait_gives_up_naming_the_lock(host: Host):  # noqa: F811
    h = host
    holder = _held_lock(h, 120)
    try:
        r = run_agent(h, "recover", "--wait", "0.5")
    finally:
        holder.release()
    assert r.returncode == 1
    assert "still holds" in r.stderr and "netns-" in r.stderr and "Traceback" not in r.stderr
