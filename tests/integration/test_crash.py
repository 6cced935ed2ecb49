"""Crash safety: an apply killed (SIGKILL) or interrupted (exception) at every step of a mixed
change leaves host, journal and history agreeing: before its commit line the old host and the
old history, after it the new ones; with a fresh history and with a full one (pruning).

The agent's test-only switch TOPO_AGENT_CRASH_AFTER=k (topoagent.apply.journal) makes it die right
after operation k (0: after the journal header; n + 1: after the history entry is written; n + 2:
after the commit line), so every point of the transaction is hit deterministically, not by luck
of timing. The host is read with iproute2 and /proc (tests.netns.host_dump); that the history
agrees with it, by `watch --once` (in sync: the newest history entry is what the host is). One
pair of namespaces serves the whole module (each test starts by applying its old state), and
the ~130 agent processes are children of a fork server (tests.integration.forkagent): real
processes, killed for real, without an interpreter's start-up each (4x less time)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzgen import fuzz_settings
from tests.integration.forkagent import ForkAgent
from tests.integration.test_agent import Host, dump, full_state
from tests.netns import PREFIX, sh

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


def variant() -> dict:
    """full_state() and one more route: another state that sets the same attributes."""
    s = full_state()
    s["routes"] = [*s["routes"], {"dst": "10.236.11.0/24", "via": "10.231.1.2"}]
    return s


def run_agent(h: Host, *args: str, stdin: str | None = None,
              env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "topoagent.cli", "--netns", h.ns, "--state-dir",
           str(h.state_dir), *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@dataclasses.dataclass
class FastHost(Host):
    """A Host whose agent calls are children of a fork server (tests.integration.forkagent):
    real processes, really killed, without the interpreter's start-up each time."""

    fork: ForkAgent | None = None

    def run(self, *args: str, stdin: str | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
        assert self.fork is not None
        return self.fork.run(["--netns", self.ns, "--state-dir", str(self.state_dir), *args],
                             stdin=stdin, env=env)

    def agent(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return self.run(*args, stdin=stdin)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Iterator[FastHost]:
    """The `host` of test_agent, made once for the module (its namespaces are the slow part)."""
    ns, peer = f"{PREFIX}{os.getpid()}-crash", f"{PREFIX}{os.getpid()}-crashpeer"
    tmp = tmp_path_factory.mktemp("crash")
    fork = ForkAgent(tmp)
    try:
        for name in (ns, peer):
            sh(["ip", "netns", "add", name])
            sh(["ip", "-n", name, "link", "set", "lo", "up"])
        sh(["ip", "-n", ns, "link", "add", "tpa0", "type", "veth", "peer", "name", "tpb0",
            "netns", peer])
        sh(["ip", "-n", peer, "addr", "add", "10.231.1.2/24", "dev", "tpb0"])
        sh(["ip", "-n", peer, "link", "set", "tpb0", "up"])
        sh(["ip", "-n", ns, "link", "add", "tpc0", "type", "veth", "peer", "name", "tpd0"])
        yield FastHost(ns, peer, tmp / "state", tmp, fork)
    finally:
        fork.close()
        for name in (ns, peer):
            sh(["ip", "netns", "del", name], check=False)


@pytest.fixture
def host(shared: FastHost, tmp_path) -> FastHost:
    """The shared namespaces with a state directory of the test's own."""
    return dataclasses.replace(shared, state_dir=tmp_path / "state", tmp=tmp_path)


def operations(h: Host, state: dict) -> int:
    return len(json.loads(h.agent("--json", "diff", "-",
                                  stdin=yaml.safe_dump(state)).stdout)["operations"])


def history(h: Host) -> list[str]:
    return sorted(p.name for p in (h.state_dir / "history").glob("*.json"))


def agreeing(h: FastHost, k: int, note: str = "") -> None:
    """Recovery (this agent start runs it first) leaves no journal and a history whose newest
    entry the host matches: `watch --once` says in sync."""
    r = h.run("--json", "watch", "--once", "--detailed-exitcode")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "in sync", (
        k, note, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, (k, r.stderr)
    if note:
        assert note in r.stderr, (k, r.stderr)
    assert not (h.state_dir / "journal").exists(), k


def crash(h: FastHost, k: int, mode: str, text: str, *extra: str) -> subprocess.CompletedProcess:
    env = {"TOPO_AGENT_CRASH_AFTER": str(k), "TOPO_AGENT_CRASH_MODE": mode}
    # no next-hop probes: they are not what is under test, and cost 0.5 s per apply here
    return h.run(*extra, "apply", "--no-probe", "-", stdin=text, env=env)


def test_kill_at_every_step_with_a_full_history(host: FastHost):
    """--keep-history 2: baseline + 2 entries, so every apply prunes one. A kill before the
    commit line leaves the old host and the old newest entry (the rollback target unchanged),
    after it the new host and the new entry; the history never grows past keep + 1."""
    old, new = full_state(), new_state()
    keep = ("--keep-history", "2")
    for state in (old, variant(), old):
        assert host.run(*keep, "apply", "-", stdin=yaml.safe_dump(state)).returncode == 0
    assert history(host) == ["0000.json", "0002.json", "0003.json"]  # full: 0001 pruned
    original = dump(host.ns)
    n = operations(host, new)
    assert n >= 25, n  # a mixed change, not a token one
    text = yaml.safe_dump(new)
    for k in range(0, n + 3):
        r = crash(host, k, "kill", text, *keep)
        assert r.returncode == -9, (k, r.returncode, r.stderr)
        assert (host.state_dir / "journal").exists()
        if k <= n + 1:
            agreeing(host, k, "host is as before")
            assert dump(host.ns) == original, k
        else:  # after the commit line: the apply happened, recovery completes its history
            agreeing(host, k, "after its commit")
            assert host.diff(new).returncode == 0
            back = host.run(*keep, "rollback")
            assert back.returncode == 0, back.stderr
            assert dump(host.ns) == original  # the rollback's target is the old state
        assert len(history(host)) == 3, (k, history(host))
    print(f"\ncrash trials (kill, full history): {n + 3}, {n} operations")


def test_kill_at_each_write_step_with_a_fresh_history(host: FastHost):
    """The journal header, the history entry, the commit line, with a history of one entry;
    then a rollback killed before and after its commit line."""
    old, new = full_state(), new_state()
    assert host.apply(old).returncode == 0
    original = dump(host.ns)
    n = operations(host, new)
    text = yaml.safe_dump(new)
    for k in (0, n + 1, n + 2):
        assert crash(host, k, "kill", text).returncode == -9, k
        rec = host.run("recover")  # the verb itself, as an operator runs it
        assert rec.returncode == 0 and "Traceback" not in rec.stderr, (k, rec.stderr)
        if k <= n + 1:
            assert "host is as before" in rec.stderr, (k, rec.stderr)
            assert history(host) == ["0000.json", "0001.json"], k
            assert dump(host.ns) == original, k
        else:
            assert "after its commit" in rec.stderr, (k, rec.stderr)
            assert history(host) == ["0000.json", "0001.json", "0002.json"], k
        agreeing(host, k)
    # a rollback is one transaction too: killed before its commit line it did not happen
    # (the host new, the newest entry kept), after it it did (the host old, the entry gone)
    m = len(json.loads(host.run("--json", "rollback", "--dry-run").stdout)["operations"])
    for k, newest in ((m + 1, "0002.json"), (m + 2, "0001.json")):
        r = host.run("rollback", "--no-probe", env={"TOPO_AGENT_CRASH_AFTER": str(k)})
        assert r.returncode == -9, (k, r.stderr)
        agreeing(host, k)
        assert history(host)[-1] == newest, (k, history(host))
    assert dump(host.ns) == original


def test_raise_after_every_operation_reverts_in_process(host: FastHost):
    """An exception (not a kill) after operation k: the apply reverts itself and exits 1;
    after the commit line it has happened and the next start completes it."""
    old, new = full_state(), new_state()
    assert host.apply(old).returncode == 0
    original = dump(host.ns)
    n = operations(host, new)
    text = yaml.safe_dump(new)
    outcomes: dict[str, int] = {"trials": 0, "half-configured": 0}
    for k in range(0, n + 3):
        r = crash(host, k, "raise", text)
        assert r.returncode == 1, (k, r.returncode, r.stderr)
        assert "simulated crash" in r.stderr, r.stderr
        outcomes["trials"] += 1
        if k == n + 2:
            agreeing(host, k, "after its commit")
            assert host.diff(copy.deepcopy(new)).returncode == 0
            continue
        now = dump(host.ns)
        outcomes["half-configured"] += now != original
        assert now == original, (k, r.stderr)
        assert not (host.state_dir / "journal").exists()
        if k in (0, n, n + 1):
            agreeing(host, k)
    print(f"\ncrash trials (raise): {outcomes}, {n} operations")
    assert host.agent("rollback", "--detailed-exitcode").returncode == 2
    assert dump(host.ns) == original


def test_any_agent_start_recovers_first(host: FastHost):
    assert host.apply(full_state()).returncode == 0
    original = dump(host.ns)
    r = host.run("apply", "-", stdin=yaml.safe_dump(new_state()),
                  env={"TOPO_AGENT_CRASH_AFTER": "7"})
    assert r.returncode == -9
    assert dump(host.ns) != original  # half-configured until an agent starts
    r = host.agent("show")
    assert r.returncode == 0 and "recovered an apply interrupted" in r.stderr
    assert dump(host.ns) == original


def test_a_torn_journal_line_is_ignored(host: FastHost):
    assert host.apply(full_state()).returncode == 0
    original = dump(host.ns)
    r = host.run("apply", "-", stdin=yaml.safe_dump(new_state()),
                  env={"TOPO_AGENT_CRASH_AFTER": "3"})
    assert r.returncode == -9
    with open(host.state_dir / "journal", "a") as f:
        f.write('{"n":4,"undo":{"op":"SetLi')  # power lost mid-write
    assert host.run("recover", "--detailed-exitcode").returncode == 2
    assert dump(host.ns) == original


HEADERS = {  # what a torn write, a bad edit or a damaged disk can leave of a journal's header
    "empty": lambda good: b"",
    "torn header only": lambda good: good[:good.index(b"\n") // 2],
    "half header": lambda good: b'{"journal": 2, "before": [' + good[good.index(b"\n"):],
    "garbage": lambda good: b"\x00\xffgarbage" + good[good.index(b"\n"):],
    "null": lambda good: b"null" + good[good.index(b"\n"):],
    "a list": lambda good: b"[1]" + good[good.index(b"\n"):],
    "no snapshot": lambda good: b'{"journal": 2}' + good[good.index(b"\n"):],
    "nested": lambda good: b"[" * 100_000 + good[good.index(b"\n"):],
}


@pytest.mark.parametrize("damage", list(HEADERS))
def test_a_journal_whose_header_cannot_be_read_is_judged_by_the_history(host: FastHost,
                                                                         damage: str):
    """Issue 50 item 4: a header that cannot be read (empty, torn, garbage, half-written) was
    deleted with "0 operations undone; host is as before" while the host stayed half-applied.
    Without its header nobody knows what the host was, so the host is compared with the
    history's last committed state and set to it (the undo lines that can be read first): the
    message says what differed, never "as before"; the journal is moved aside for the
    operator, and every verb works after."""
    assert host.apply(full_state()).returncode == 0
    original = dump(host.ns)
    r = host.run("apply", "-", stdin=yaml.safe_dump(new_state()),
                  env={"TOPO_AGENT_CRASH_AFTER": "5"})
    assert r.returncode == -9
    path = host.state_dir / "journal"
    path.write_bytes(HEADERS[damage](path.read_bytes()))
    assert dump(host.ns) != original  # half-applied
    r = host.run("recover")
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "host is as before" not in r.stderr, r.stderr
    assert "compared with the last committed state (history entry 1)" in r.stderr, r.stderr
    assert "difference(s) set to it" in r.stderr, r.stderr
    assert dump(host.ns) == original
    assert not path.exists() and list(host.state_dir.glob("journal.damaged.*"))
    agreeing(host, 0)
    assert host.run("rollback").returncode == 0  # every verb works


@given(header=st.binary(max_size=300).filter(lambda b: b"\n" not in b),
       keep_lines=st.booleans())
@fuzz_settings(int(os.environ.get("TOPO_FUZZ_JOURNAL_EXAMPLES", "6")))
def test_fuzz_any_journal_header_ends_with_the_committed_state(shared: FastHost, header: bytes,
                                                               keep_lines: bool):
    """Item 4's family as a fuzz: any bytes as the header line of a half-applied journal (with
    or without its undo lines): recovery ends with the host in the last committed state,
    never a traceback, never "as before"."""
    import shutil
    import tempfile
    host = dataclasses.replace(shared, state_dir=Path(tempfile.mkdtemp(prefix="tpt-jfz-")))
    try:
        assert host.apply(full_state()).returncode == 0
        original = dump(host.ns)
        r = host.run("apply", "-", stdin=yaml.safe_dump(new_state()),
                      env={"TOPO_AGENT_CRASH_AFTER": "5"})
        assert r.returncode == -9
        path = host.state_dir / "journal"
        good = path.read_bytes()
        rest = good[good.index(b"\n"):] if keep_lines else b""
        path.write_bytes(header + rest)
        r = host.run("recover")
        assert "Traceback" not in r.stderr and "host is as before" not in r.stderr, r.stderr
        assert r.returncode == 0, r.stderr
        assert dump(host.ns) == original
        agreeing(host, 0)
    finally:
        shutil.rmtree(host.state_dir, ignore_errors=True)
