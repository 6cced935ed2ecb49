"""`topo-agent recover --wait`: what topoctl asks over a new connection when an SSH session
dropped under an apply. While another agent holds the store lock (its apply still running) the
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

pytestmark = pytest.mark.netns


def _held_lock(h: Host, seconds: float) -> threading.Thread:
    """Hold the store's lock for `seconds` from another thread, as a running apply does."""
    taken = threading.Event()
    h.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def hold() -> None:
        with open(h.state_dir / "lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            taken.set()
            time.sleep(seconds)
    t = threading.Thread(target=hold)
    t.start()
    assert taken.wait(5)
    return t


def test_recover_waits_for_the_running_apply_then_replays_its_journal(host: Host):  # noqa: F811
    h = host
    assert h.apply(full_state()).returncode == 2
    old = dump(h.ns)
    killed = run_agent(h, "apply", "-", stdin=yaml.safe_dump(new_state()),
                       env={"TOPO_AGENT_CRASH_AFTER": "4"})
    assert killed.returncode == -9
    assert (h.state_dir / "journal").exists() and dump(h.ns) != old

    holder = _held_lock(h, 1.5)
    try:
        busy = run_agent(h, "--json", "recover")  # no wait: a live journal is left alone
        assert busy.returncode == 0 and json.loads(busy.stdout)["recovered"] is False
        assert (h.state_dir / "journal").exists()
        t0 = time.monotonic()
        waited = subprocess.run([sys.executable, "-m", "topoagent.cli", "--netns", h.ns,
                                 "--state-dir", str(h.state_dir), "--json", "recover",
                                 "--wait", "20"], capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
    finally:
        holder.join()
    assert waited.returncode == 2, waited.stderr
    assert json.loads(waited.stdout)["recovered"] is True
    assert took >= 0.5, took  # it did wait for the lock
    assert not (h.state_dir / "journal").exists()
    assert dump(h.ns) == old


def test_recover_wait_gives_up_naming_the_lock(host: Host):  # noqa: F811
    h = host
    holder = _held_lock(h, 1.5)
    try:
        r = run_agent(h, "recover", "--wait", "0.5")
    finally:
        holder.join()
    assert r.returncode == 1
    assert "still holds" in r.stderr and "lock" in r.stderr and "Traceback" not in r.stderr
