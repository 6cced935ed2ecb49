"""The state directory belongs to the agent: owned by its uid, 0700, no symlink followed.
Unusable directories (another uid, a symlink, read-only, full) and malformed files in them
(journal, history, confirmation record) are one error naming the path (exit 1), never a
traceback, the host untouched; `show` and `diff` (they read the kernel alone) still work.

Real namespaces and agent processes; read-only and full file systems are small tmpfs mounts in
the test's own temporary directory, unmounted at teardown."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.forkagent import ForkAgent
from tests.netns import ip_json, sh

pytestmark = pytest.mark.netns

A = {"interfaces": [{"name": "lo", "addresses": ["10.231.99.1/32"]}]}
B = {"interfaces": [{"name": "lo", "addresses": ["10.231.99.1/32", "10.231.99.2/32"]}]}


_FORK: list[ForkAgent] = []


@pytest.fixture(scope="module", autouse=True)
def _fork(tmp_path_factory) -> Iterator[None]:
    """One fork server (tests.integration.forkagent) for the module's ~150 agent calls."""
    _FORK.append(ForkAgent(tmp_path_factory.mktemp("fork")))
    yield
    _FORK.pop().close()


def agent(ns: str, state_dir: Path, *args: str, stdin: str | None = None
          ) -> subprocess.CompletedProcess:
    """`topo-agent --netns NS --state-dir STATE_DIR ARGS`, a real process of its own."""
    return _FORK[0].run(["--netns", ns, "--state-dir", str(state_dir), *args], stdin=stdin)


def addresses(ns: str) -> set[str]:
    return {f"{a['local']}/{a['prefixlen']}" for link in ip_json(ns, "-4", "addr", "show")
            for a in link.get("addr_info", [])}


def refused(r: subprocess.CompletedProcess, *names: str) -> None:
    """Exit 1, one clear error naming the path, no traceback."""
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert all(n.lower() in r.stderr.lower() for n in names), (names, r.stderr)


def shows(ns: str, state_dir: Path) -> None:
    r = agent(ns, state_dir, "show")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and yaml.safe_load(r.stdout)["interfaces"]


@pytest.fixture
def ns(make_netns) -> str:
    return make_netns()


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Path]:
    """A 64 KiB tmpfs in the test's temporary directory."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    sh(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tpt-store", str(mnt)])
    try:
        yield mnt
    finally:
        if sh(["umount", str(mnt)], check=False).returncode != 0:
            sh(["umount", "-l", str(mnt)], check=False)


def test_a_state_dir_of_another_uid_is_refused(ns: str, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 65534, 65534)
    r = agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A))
    refused(r, str(state), "uid 65534")
    assert addresses(ns) == {"127.0.0.1/8"}
    assert os.stat(state).st_uid == 65534 and not list(state.iterdir())  # nothing adopted
    shows(ns, state)


def test_a_loose_state_dir_of_ours_is_made_0700(ns: str, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)  # an older agent's, made with the umask
    assert agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A)).returncode == 0
    assert os.stat(state).st_mode & 0o777 == 0o700
    for f in (state / "history").iterdir():
        assert f.stat().st_mode & 0o777 == 0o600, f


def test_no_symlink_in_the_state_dir_is_followed(ns: str, tmp_path):
    """A symlinked temporary file (the audit's history/.0000.tmp pointing at a root-owned
    file elsewhere), history entry, journal or state directory: refused naming it, the file
    it points to untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    assert agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A)).returncode == 0
    history = state / "history"
    # the temporary names of the baseline and the next entry, in any agent's spelling
    links = [history / n for n in (".0000.tmp", ".0000.json.tmp", ".0002.tmp",
                                   ".0002.json.tmp")]
    for link in links:
        link.symlink_to(victim)
    r = agent(ns, state, "apply", "-", stdin=yaml.safe_dump(B))
    assert victim.read_text() == "precious\n"
    refused(r, "symlink")
    assert addresses(ns) == {"127.0.0.1/8", "10.231.99.1/32"}
    for link in links:
        link.unlink()

    entry = history / "0000.json"  # the baseline: what a rollback returns to here
    entry.rename(tmp_path / "entry.json")
    entry.symlink_to(tmp_path / "entry.json")
    refused(agent(ns, state, "rollback"), str(entry), "symlink")
    (tmp_path / "entry.json").rename(entry)

    (state / "journal").symlink_to(victim)
    refused(agent(ns, state, "recover"), str(state / "journal"), "symlink")
    shows(ns, state)
    assert victim.read_text() == "precious\n"
    (state / "journal").unlink()

    linked = tmp_path / "linked-state"
    linked.symlink_to(state)
    refused(agent(ns, linked, "apply", "-", stdin=yaml.safe_dump(B)), str(linked), "symlink")
    assert addresses(ns) == {"127.0.0.1/8", "10.231.99.1/32"}


def test_a_read_only_state_dir_is_named(ns: str, tmpfs: Path):
    state = tmpfs / "state"
    assert agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A)).returncode == 0
    sh(["mount", "-o", "remount,ro", str(tmpfs)])
    for args in (["apply", "-"], ["rollback"], ["watch", "--once", "--repair"]):
        r = agent(ns, state, *args, stdin=yaml.safe_dump(B))
        refused(r, str(state), "read-only")
    assert addresses(ns) == {"127.0.0.1/8", "10.231.99.1/32"}
    shows(ns, state)
    assert agent(ns, state, "diff", "-", stdin=yaml.safe_dump(B)).returncode == 0


def test_a_full_state_dir_fails_whole_at_every_write_step(ns: str, tmpfs: Path):
    """ENOSPC at each write of a transaction (the baseline, the journal's header, its lines,
    the history entry, the commit line), by leaving less and less room: the apply either
    succeeds whole or fails whole (exit 1 naming the file, the host as before, no journal),
    and the history agrees with the host either way."""
    state = tmpfs / "state"
    assert agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A)).returncode == 0
    big = {"interfaces": [{"name": "lo", "addresses": [f"10.231.{i}.{j}/32" for i in (98, 99)
                                                      for j in range(1, 120)]}]}
    filler = tmpfs / "filler"
    outcomes, kinds = [], set()
    for room in (0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48):
        filler.unlink(missing_ok=True)
        _fill(filler, room * 1024)
        r = agent(ns, state, "apply", "--no-probe", "-", stdin=yaml.safe_dump(big))
        assert "Traceback" not in r.stderr, (room, r.stderr)
        assert r.returncode in (0, 1), (room, r.returncode, r.stderr)
        assert not (state / "journal").exists(), room
        outcomes.append(r.returncode)
        if "journal: cannot write" in r.stderr:
            kinds.add("journal line" if "reverted" in r.stderr else "journal header")
        elif "history/" in r.stderr:
            kinds.add("history entry")
        if r.returncode == 1:
            assert str(state) in r.stderr and "No space left" in r.stderr, (room, r.stderr)
            assert addresses(ns) == {"127.0.0.1/8", "10.231.99.1/32"}, room
        filler.unlink()
        w = agent(ns, state, "--json", "watch", "--once")  # the history agrees with the host
        assert json.loads(w.stdout)["status"] == "in sync", (room, w.stdout, w.stderr)
        if r.returncode == 0:
            assert agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A)).returncode == 0
    assert outcomes[0] == 1 and 0 in outcomes, outcomes
    assert kinds == {"journal header", "journal line", "history entry"}, kinds


def _fill(path: Path, room: int) -> None:
    """Fill the file system of `path` up to `room` bytes left (whole pages)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        st = os.statvfs(path)
        os.ftruncate(fd, 0)
        size = max(0, st.f_bavail * st.f_frsize - room)
        os.posix_fallocate(fd, 0, size) if size else None
    finally:
        os.close(fd)


VARIANTS = {  # what a torn write, a bad edit or another program can leave
    "empty": b"",
    "torn": b'{"state": "pending", "tok',
    "null": b"null",
    "a list": b"[]",
    "a string": b'"pending"',
    "nested": b"[" * 100_000,
    "binary": b"\xff\xfe\x00\x01garbage",
    "NaN deadline": b'{"state": "pending", "token": "t", "armed": 1, "deadline": NaN, '
                    b'"seconds": 5, "newest": 1, "watchdog": null}',
    "no deadline": b'{"state": "pending", "token": "t", "armed": 1, "seconds": 5, '
                   b'"newest": 1, "watchdog": null}',
}


@pytest.mark.parametrize("name", ["confirm.json", "journal", "history/0000.json"])
def test_a_malformed_record_is_named_and_show_still_works(ns: str, tmp_path, name: str):
    state = tmp_path / "state"
    assert agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A)).returncode == 0
    path = state / name
    for variant, data in VARIANTS.items():
        # a journal's line counts once its newline is there (without it: torn, never run)
        path.write_bytes(data + b"\n" if name == "journal" and data else data)
        if name == "journal":
            # no header to read: the first agent start judges the host by the history (A,
            # which it matches) and sets the journal aside (tests/integration/test_crash.py)
            r = agent(ns, state, "show")
            assert r.returncode == 0, (variant, r.stderr)
            assert "compared with the last committed state" in r.stderr, (variant, r.stderr)
            assert not path.exists()
            assert agent(ns, state, "apply", "-", stdin=yaml.safe_dump(B)).returncode == 0
            assert agent(ns, state, "apply", "-", stdin=yaml.safe_dump(A)).returncode == 0
            continue
        shows(ns, state)
        r = agent(ns, state, "apply", "-", stdin=yaml.safe_dump(B))
        assert "Traceback" not in r.stderr, (variant, r.stderr)
        refused(r, str(path))
        assert addresses(ns) == {"127.0.0.1/8", "10.231.99.1/32"}, variant
    if name == "journal":
        return
    verbs = ([["rollback"]] if name.startswith("history") else  # the baseline: rollback's
             [["rollback"], ["watch", "--once"], ["recover"], ["confirm"]])
    for args in verbs:
        refused(agent(ns, state, *args), str(path))
    path.unlink()
