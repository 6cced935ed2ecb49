"""Crash safety: an apply killed (SIGKILL) or interrupted (exception) after every single
operation of a mixed change leaves, after recovery, exactly the old host.

The agent's test-only switch TOPO_AGENT_CRASH_AFTER=k (topoagent.apply.journal) makes it die right
after operation k, so every point of the transaction is hit deterministically, not by luck of
timing. The comparison reads the host with iproute2 and /proc (tests.netns.host_dump)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.integration.test_agent import Host, dump, full_state, host  # noqa: F401

pytestmark = pytest.mark.netns


def new_state() -> dict:
    """Every object kind changes from full_state(): MTU and link state, sysctls, addresses
    (one moved within its subnet, which drops the routes through it), routes replaced, added,
    deleted, multipath weights, rules, QoS classes, a second HTB tree."""
    s = full_state()
    s["interfaces"][0]["addresses"] = ["10.231.1.1/24", "10.231.1.5/24"]
    s["interfaces"][0]["mtu"] = 1400
    s["interfaces"][1]["addresses"] = ["10.231.3.7/24"]
    s["interfaces"][1]["mtu"] = 1500
    s["interfaces"][2]["up"] = False
    s["interfaces"][3]["addresses"] = ["10.236.9.3/32"]
    s["sysctl"] = {"ip_forward": False, "rp_filter": {"all": 1, "tpa0": 0, "tpc0": 2}}
    s["routes"] = [
        {"dst": "10.236.9.2/32", "via": "10.231.1.2"},
        {"dst": "10.236.9.0/24", "table": 100, "nexthops": [
            {"via": "10.231.1.2", "dev": "tpa0", "weight": 1},
            {"via": "10.231.3.2", "dev": "tpc0", "weight": 5}]},
        {"dst": "10.236.10.0/24", "table": 200, "nexthops": [
            {"via": "10.231.1.2", "dev": "tpa0"}, {"via": "10.231.3.9", "dev": "tpc0"}]},
    ]
    s["rules"] = [
        {"priority": 1000, "from": "10.236.9.3/32", "to": "10.236.9.0/24", "table": 100},
        {"priority": 1002, "to": "10.236.10.0/24", "table": 200},
    ]
    s["qos"] = [
        {"dev": "tpa0", "rate": "300mbit", "classes": [
            {"dst": "10.236.9.2", "rate": "80mbit"},
            {"id": 41, "dst": "10.236.10.0/24", "rate": "100mbit"}]},
        {"dev": "tpc0", "rate": "1gbit", "classes": [{"dst": "10.236.9.0/24",
                                                      "rate": "500mbit"}]},
    ]
    return s


def run_agent(h: Host, *args: str, stdin: str | None = None,
              env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "topoagent.cli", "--netns", h.ns, "--state-dir",
           str(h.state_dir), *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_kill_or_raise_after_every_operation_recovers_the_old_host(host: Host):  # noqa: F811
    old, new = full_state(), new_state()
    assert host.apply(old).returncode == 0
    original = dump(host.ns)
    n = len(json.loads(host.agent("--json", "diff", "-",
                                  stdin=yaml.safe_dump(new)).stdout)["operations"])
    assert n >= 25, n  # a mixed change, not a token one
    text = yaml.safe_dump(new)
    outcomes: dict[str, int] = {"trials": 0, "half-configured": 0}
    for mode in ("kill", "raise"):
        for k in range(0, n + 2):  # n + 1: after the history is written, before commit
            env = {"TOPO_AGENT_CRASH_AFTER": str(k), "TOPO_AGENT_CRASH_MODE": mode}
            r = run_agent(host, "apply", "-", stdin=text, env=env)
            if mode == "kill":
                assert r.returncode == -9, (k, r.returncode, r.stderr)
                assert (host.state_dir / "journal").exists()
                rec = run_agent(host, "recover")
                assert rec.returncode == 0, (k, rec.stderr)
                assert "host is as before" in rec.stderr, (k, rec.stderr)
            else:
                assert r.returncode == 1, (k, r.returncode, r.stderr)
                assert "simulated crash" in r.stderr, r.stderr
            outcomes["trials"] += 1
            now = dump(host.ns)
            if now != original:
                outcomes["half-configured"] += 1
            assert now == original, (mode, k, r.stderr)
            assert not (host.state_dir / "journal").exists()
            # the history matches the host: nothing to do for the old state
            assert host.diff(copy.deepcopy(old)).returncode == 0
    print(f"\ncrash trials: {outcomes}, {n} operations")
    # and the apply itself still goes through, and rolls back to the old host
    assert host.apply(new, "--detailed-exitcode").returncode == 2
    assert host.agent("rollback", "--detailed-exitcode").returncode == 2
    assert dump(host.ns) == original


def test_any_agent_start_recovers_first(host: Host):  # noqa: F811
    assert host.apply(full_state()).returncode == 0
    original = dump(host.ns)
    r = run_agent(host, "apply", "-", stdin=yaml.safe_dump(new_state()),
                  env={"TOPO_AGENT_CRASH_AFTER": "7"})
    assert r.returncode == -9
    assert dump(host.ns) != original  # half-configured until an agent starts
    r = host.agent("show")
    assert r.returncode == 0 and "recovered an apply interrupted" in r.stderr
    assert dump(host.ns) == original


def test_a_torn_journal_line_is_ignored(host: Host):  # noqa: F811
    assert host.apply(full_state()).returncode == 0
    original = dump(host.ns)
    r = run_agent(host, "apply", "-", stdin=yaml.safe_dump(new_state()),
                  env={"TOPO_AGENT_CRASH_AFTER": "3"})
    assert r.returncode == -9
    with open(host.state_dir / "journal", "a") as f:
        f.write('{"n":4,"undo":{"op":"SetLi')  # power lost mid-write
    assert run_agent(host, "recover", "--detailed-exitcode").returncode == 2
    assert dump(host.ns) == original
