"""`topo-agent watch --once` on a real namespace: drift made with `ip` is detected, reported in
the status file and, with --repair, repaired; iproute2 confirms every step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.netns import ip_json, sh

pytestmark = pytest.mark.netns

STATE = {
    "interfaces": [{"name": "tpw0", "addresses": ["10.231.7.1/24"], "up": True}],
    "routes": [{"dst": "10.236.7.0/24", "via": "10.231.7.2"}],
}


def agent(ns: str, state_dir: Path, *args: str, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "topoagent.cli", "--netns", ns, "--state-dir",
                           str(state_dir), "--json", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


def routes(ns: str) -> set[str]:
    return {r["dst"] for r in ip_json(ns, "-4", "route", "show") if r.get("protocol") == "76"}


@pytest.fixture
def host(make_netns, tmp_path):
    ns = make_netns()
    sh(["ip", "-n", ns, "link", "add", "tpw0", "type", "veth", "peer", "name", "tpw1"])
    return ns, tmp_path / "state"


def test_watch_idle_then_in_sync_then_drift_detected_then_repaired(host):
    ns, state_dir = host
    status = state_dir / "watch.json"
    r = agent(ns, state_dir, "watch", "--once")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "idle", r.stderr

    assert agent(ns, state_dir, "apply", "--no-probe", "-",
                 stdin=yaml.safe_dump(STATE)).returncode == 0
    r = agent(ns, state_dir, "watch", "--once")
    assert r.returncode == 0 and json.loads(status.read_text())["status"] == "in sync"

    sh(["ip", "-n", ns, "route", "del", "10.236.7.0/24"])  # drift, made behind the agent
    r = agent(ns, state_dir, "watch", "--once", "--detailed-exitcode")
    assert r.returncode == 2, r.stderr
    doc = json.loads(status.read_text())
    assert doc["status"] == "drifted" and any("10.236.7.0/24" in d for d in doc["drift"])
    assert routes(ns) == set()  # reporting alone repairs nothing

    r = agent(ns, state_dir, "watch", "--once", "--repair", "--detailed-exitcode")
    assert r.returncode == 2, r.stderr
    assert json.loads(status.read_text())["status"] == "repaired"
    assert routes(ns) == {"10.236.7.0/24"}
    history = sorted((state_dir / "history").glob("*.json"))
    assert len(history) == 2  # a repair re-applies the same state: no new history entry
    assert agent(ns, state_dir, "watch", "--once").returncode == 0  # in sync again

    sh(["ip", "-n", ns, "link", "set", "tpw0", "down"])
    custom = state_dir.parent / "custom-status.json"
    r = agent(ns, state_dir, "watch", "--once", "--status-file", str(custom), "--detailed-exitcode")
    assert r.returncode == 2 and json.loads(custom.read_text())["status"] == "drifted"


def test_watch_reports_an_error_for_a_missing_namespace(tmp_path):
    r = agent("tpt-no-such-ns", tmp_path, "watch", "--once")
    assert r.returncode == 1 and "no such network namespace" in r.stdout
