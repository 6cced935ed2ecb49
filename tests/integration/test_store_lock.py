"""One lock per host: every writer (apply, rollback, recover, confirm, watch --repair) holds the
host's lock from reading the last applied state to committing the new one, whatever state
directory it was given. Real namespaces and agent processes; iproute2 reads the host back."""

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
from tests.integration.test_crash import new_state, variant

pytestmark = pytest.mark.netns


def agent_argv(h: Host, state_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "topoagent.cli", "--netns", h.ns, "--state-dir",
            str(state_dir), *args]


def entries(state_dir: Path) -> list[dict]:
    """The applied states of the history, oldest first (the baseline left out)."""
    files = sorted((state_dir / "history").glob("[0-9][0-9][0-9][0-9].json"))
    return [json.loads(f.read_text()) for f in files[1:]]


def routes_of(doc: dict) -> set[str]:
    return {r["dst"] for r in doc.get("routes", [])}


def numbered(i: int) -> dict:
    """Distinct states, alternating between two far apart (29 operations between them): a
    state the loop re-applied cannot pass for one of the operator's."""
    s = new_state() if i % 2 else full_state()
    s["routes"] = [*s["routes"], {"dst": f"10.236.{20 + i}.0/24", "via": "10.231.1.2"}]
    return s


def test_watch_repair_never_undoes_a_committed_apply(host: Host):  # noqa: F811
    """Applies of ever new states while `watch --repair` loops: every apply that said
    "changes made" stays, and the history holds the applies' states only. (The round's
    unlocked look saw the older state; re-applying it under the lock undid the apply: 4 of 8
    applies at 0.05 s, before the repair read the last applied state again under the lock.)"""
    assert host.apply(numbered(0), "--no-probe").returncode == 0
    status = host.tmp / "watch.json"
    loop = subprocess.Popen(agent_argv(host, host.state_dir, "watch", "--repair",
                                       "--interval", "0.02", "--status-file", str(status)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    made, undone = [numbered(0)], []
    try:
        for i in range(1, 11):
            r = host.apply(numbered(i), "--no-probe")
            if r.returncode != 0:  # a round held the lock just then: refused whole
                assert "another topo-agent is applying" in r.stderr, r.stderr
                continue
            made.append(numbered(i))
            time.sleep(0.2)  # a few rounds of the loop
            if routes_of(entries(host.state_dir)[-1]) != routes_of(made[-1]):
                undone.append(i)
    finally:
        loop.send_signal(signal.SIGTERM)
        _, err = loop.communicate(timeout=30)
    assert "Traceback" not in err, err
    assert json.loads(status.read_text())["rounds"] >= 20  # the loop ran all along
    assert not undone, f"applies undone by watch --repair: {undone} of {len(made) - 1}"
    assert len(made) >= 6, "the applies hardly ever got the lock"
    r = host.agent("--json", "diff", "--detailed-exitcode", "-", stdin=yaml.safe_dump(made[-1]))
    assert r.returncode == 0, r.stdout
    assert [routes_of(e) for e in entries(host.state_dir)] == [routes_of(s) for s in made]


def test_two_state_directories_on_one_host_share_one_lock(host: Host):  # noqa: F811
    """An apply paused half-way (SIGSTOP, the lock held) under one state directory: an apply,
    a rollback, a recover and a watch --repair under another state directory of the same
    namespace are refused or wait; the paused apply then finishes."""
    first, other = host.state_dir, host.tmp / "other-state"
    assert host.apply(full_state(), "--no-probe").returncode == 0
    assert subprocess.run(agent_argv(host, other, "apply", "--no-probe", "-"),
                          input=yaml.safe_dump(full_state()), capture_output=True,
                          text=True).returncode == 0
    paused = _paused_apply(host, first)
    try:
        half = dump(host.ns)
        for args in (["apply", "--no-probe", "-"], ["rollback"], ["watch", "--once",
                                                                   "--repair"]):
            r = subprocess.run(agent_argv(host, other, "--json", *args),
                               input=yaml.safe_dump(variant()), capture_output=True, text=True)
            assert "Traceback" not in r.stderr, (args, r.stderr)
            out = json.loads(r.stdout)
            assert r.returncode == 1 or out.get("status") == "busy", (args, r.stdout)
            assert "another topo-agent" in r.stdout or out.get("status") == "busy", r.stdout
            assert dump(host.ns) == half, args
        r = subprocess.run(agent_argv(host, other, "recover", "--wait", "0.5"),
                           capture_output=True, text=True)
        assert r.returncode == 1 and "netns-" in r.stderr, r.stderr
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        out, err = paused.communicate(timeout=60)
    assert paused.returncode == 0, err
    assert host.diff(new_state()).returncode == 0


def _paused_apply(h: Host, state_dir: Path) -> subprocess.Popen:
    """An apply of new_state() stopped (SIGSTOP) half-way: the lock held, its journal naming
    a few operations done."""
    text = h.tmp / "new.yaml"
    text.write_text(yaml.safe_dump(new_state()))
    for _ in range(20):  # a try the apply outran (finished before the stop) starts over
        with open(text) as stdin:
            p = subprocess.Popen(agent_argv(h, state_dir, "apply", "--no-probe", "-"),
                                 stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        while p.poll() is None and _lines(state_dir / "journal") < 4:
            time.sleep(0.0002)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGSTOP)
            while _state(p.pid) != "T":
                time.sleep(0.01)
            if _lines(state_dir / "journal") >= 4:
                return p
            os.kill(p.pid, signal.SIGCONT)
        p.communicate(timeout=60)
        assert h.apply(full_state(), "--no-probe").returncode == 0  # back to the start
    raise AssertionError("could not pause an apply half-way")


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
