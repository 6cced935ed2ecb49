"""A history entry that cannot be removed (issue 50 item 10). A rollback dropped the newest entry
only after its commit line: when that failed (an immutable file, a read-only directory) the host
was already rolled back, the command exited 1, the journal stayed and every later verb failed
on it. Now the entry leaves the history (renamed aside) before the commit line, so a rollback
that cannot drop it fails whole: the host stays where the history says, and every later verb
works; once the blocker is gone the rollback goes through. Pruning after an apply's commit is
housekeeping: an old entry that cannot be pruned is a warning, not a failed apply.

Real namespace, real agent processes; the blockers are real: `chattr +i`/`+a` (the ext4 the
test's temporary directory is on) and a read-only bind mount, all undone at teardown."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.forkagent import ForkAgent
from tests.netns import ip_json, sh

pytestmark = pytest.mark.netns

A = {"interfaces": [{"name": "lo", "addresses": ["10.231.98.1/32"]}]}
B = {"interfaces": [{"name": "lo", "addresses": ["10.231.98.1/32", "10.231.98.2/32"]}]}
C = {"interfaces": [{"name": "lo", "addresses": ["10.231.98.3/32"]}]}


_FORK: list[ForkAgent] = []


@pytest.fixture(scope="module", autouse=True)
def _fork(tmp_path_factory) -> Iterator[None]:
    """One fork server (tests.integration.forkagent): real agent processes, no start-up each."""
    _FORK.append(ForkAgent(tmp_path_factory.mktemp("fork")))
    yield
    _FORK.pop().close()


def agent(ns: str, state: Path, *args: str, stdin: str | None = None
          ) -> subprocess.CompletedProcess:
    return _FORK[0].run(["--netns", ns, "--state-dir", str(state), *args], stdin=stdin)


def addresses(ns: str) -> set[str]:
    return {f"{a['local']}/{a['prefixlen']}" for link in ip_json(ns, "-4", "addr", "show")
            for a in link.get("addr_info", []) if a["local"] != "127.0.0.1"}


def ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)


@contextlib.contextmanager
def blocked(how: str, state: Path) -> Iterator[Path]:
    """The newest history entry made undeletable `how`; the path named in the error."""
    hist = state / "history"
    newest = sorted(hist.glob("[0-9][0-9][0-9][0-9].json"))[-1]
    if how == "immutable-entry":
        sh(["chattr", "+i", str(newest)])
        undo = ["chattr", "-i", str(newest)]
    elif how in ("immutable-dir", "append-only-dir"):
        sh(["chattr", "+i" if how == "immutable-dir" else "+a", str(hist)])
        undo = ["chattr", "-i" if how == "immutable-dir" else "-a", str(hist)]
    else:  # a read-only bind mount of the history directory
        sh(["mount", "--bind", str(hist), str(hist)])
        sh(["mount", "-o", "remount,bind,ro", str(hist)])
        undo = ["umount", str(hist)]
    try:
        yield newest
    finally:
        sh(undo, check=False)


BLOCKERS = ["immutable-entry", "immutable-dir", "append-only-dir", "read-only-mount"]


@pytest.mark.parametrize("how", BLOCKERS)
def test_a_rollback_that_cannot_drop_its_entry_leaves_host_and_history_agreeing(
        make_netns, tmp_path, how):
    ns, state = make_netns(), tmp_path / "state"
    ok(agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A)))
    ok(agent(ns, state, "apply", "-", stdin=yaml.safe_dump(B)))
    with blocked(how, state) as entry:
        r = agent(ns, state, "rollback")
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert entry.name in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert "host is as before" in r.stderr, r.stderr
        # the host is where the history says: B, and no journal is left behind
        assert addresses(ns) == {"10.231.98.1/32", "10.231.98.2/32"}
        assert not (state / "journal").exists()
        w = agent(ns, state, "--json", "watch", "--once")
        ok(w)
        assert json.loads(w.stdout)["status"] == "in sync"
        ok(agent(ns, state, "show"))
    # the blocker gone: every verb works, the rollback goes through
    ok(agent(ns, state, "rollback"))
    assert addresses(ns) == {"10.231.98.1/32"}
    ok(agent(ns, state, "apply", "-", stdin=yaml.safe_dump(C)))
    assert addresses(ns) == {"10.231.98.3/32"}
    assert sorted(p.name for p in (state / "history").iterdir()) == [
        "0000.json", "0001.json", "0002.json"]


def test_an_entry_that_cannot_be_pruned_is_a_warning_not_a_failed_apply(make_netns, tmp_path):
    ns, state = make_netns(), tmp_path / "state"
    ok(agent(ns, state, "--keep-history", "2", "apply", "-", stdin=yaml.safe_dump(A)))
    ok(agent(ns, state, "--keep-history", "2", "apply", "-", stdin=yaml.safe_dump(B)))
    oldest = state / "history" / "0001.json"
    sh(["chattr", "+i", str(oldest)])
    try:
        r = agent(ns, state, "--keep-history", "2", "apply", "-", stdin=yaml.safe_dump(C))
        ok(r)
        assert "warning" in r.stderr and "0001.json" in r.stderr, r.stderr
        assert addresses(ns) == {"10.231.98.3/32"} and not (state / "journal").exists()
        w = agent(ns, state, "--json", "watch", "--once")
        ok(w)
        assert json.loads(w.stdout)["status"] == "in sync"
        ok(agent(ns, state, "rollback"))  # back to B, the entry before the newest
        assert addresses(ns) == {"10.231.98.1/32", "10.231.98.2/32"}
    finally:
        sh(["chattr", "-i", str(oldest)], check=False)
