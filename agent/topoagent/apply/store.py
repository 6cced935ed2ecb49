"""The agent's memory on disk: the history of applied states, newest last.

history/0000.json is the baseline: the values of every sysctl and link attribute the agent has
ever changed, as they were before it first changed them (and no addresses, routes, rules or
QoS). Each successful apply appends the desired state; rollback re-applies the one before the
newest and drops the newest. One directory per target, so many namespaces never collide.
Files are JSON (which is YAML too): a 1,000-route state writes and reads in milliseconds.

The directory is 0700 and every file 0600 (a state names the host's addresses and routes).
Only the newest `keep` applied states stay (default 20, `--keep-history`), plus the baseline;
the baseline is written before an apply changes anything, so a crash cannot lose an original
value. Writes are atomic and fsynced (old or new file, never a torn one)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from topoagent.protocol import TopoError
from topoagent.state.host import HostState, Interface, Sysctl, parse_host_state


def _load(path: Path) -> HostState:
    return parse_host_state(json.loads(path.read_text()), prefix=str(path))


def _text(state: HostState) -> str:
    return json.dumps(state.to_dict()) + "\n"  # no indent: the C encoder


class StoreBusy(TopoError, RuntimeError):
    """Another topo-agent holds the store's lock (an apply or rollback is running)."""


DEFAULT_KEEP = 20


class Store:
    """The history of applied states of one target, with a lock so one apply or rollback runs at a
    time."""

    def __init__(self, root: Path, keep: int = DEFAULT_KEEP):
        self.root = Path(root)
        self.dir = self.root / "history"
        self.keep = max(2, keep)  # two: rollback needs the one before the newest

    def _mkdirs(self) -> None:
        for d in (self.root, self.dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            if d.stat().st_mode & 0o077:
                d.chmod(0o700)  # made by an older agent with the umask's 0755

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One apply or rollback at a time per target; a second one fails at once instead of
        interleaving its operations with the first."""
        self._mkdirs()
        fd = os.open(self.root / "lock", os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreBusy(f"another topo-agent is applying to this target "
                                f"(lock {self.root / 'lock'})") from None
            yield

    def wait_idle(self, seconds: float, poll: float = 0.1) -> None:
        """Return once no other agent holds the lock (say an apply whose SSH session dropped,
        still running); StoreBusy after `seconds`."""
        end = time.monotonic() + seconds
        while True:
            try:
                with self.lock():
                    return
            except StoreBusy:
                if time.monotonic() >= end:
                    raise StoreBusy(f"another topo-agent still holds {self.root / 'lock'} "
                                    f"after {seconds:g} s") from None
                time.sleep(poll)

    def _files(self) -> list[Path]:
        return sorted(self.dir.glob("[0-9][0-9][0-9][0-9].json")) if self.dir.exists() else []

    def baseline(self) -> HostState | None:
        """The host's original values of what applies changed (sysctls, link attributes), or
        None before the first apply."""
        files = self._files()
        return _load(files[0]) if files else None

    def last_applied(self) -> HostState | None:
        """The newest applied state, or None when nothing was applied."""
        files = self._files()
        return _load(files[-1]) if len(files) > 1 else None

    def previous(self) -> HostState | None:
        """The state a rollback returns to: the one applied before the newest, with the
        baseline's original values for every sysctl and link attribute it leaves unsaid (so a
        value first changed by the newest apply goes back too)."""
        files = self._files()
        if len(files) < 2:
            return None
        return with_baseline(_load(files[-2]), _load(files[0]))

    def history_len(self) -> int:
        """Number of history files, the baseline included."""
        return len(self._files())

    def _write(self, n: int, text: str) -> None:
        self._mkdirs()
        tmp = self.dir / f".{n:04d}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / f"{n:04d}.json")  # atomic: a crash leaves old or new
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def save_baseline(self, additions: HostState) -> None:
        """Merge the original values an apply is about to overwrite into the baseline (first
        seen wins), before the apply changes them."""
        files = self._files()
        if files and additions == HostState():
            return
        base = _load(files[0]) if files else HostState()
        merged = merge_baseline(base, additions)
        if not files or merged != base:
            self._write(0, _text(merged))

    def push(self, desired: HostState) -> None:
        """Append `desired` to the history (not again when it is the newest) and prune."""
        files = self._files()
        if not files:
            self.save_baseline(HostState())
            files = self._files()
        text = _text(desired)
        if len(files) > 1 and files[-1].read_text() == text:
            return  # re-applying the same state does not grow the history
        self._write(int(files[-1].stem) + 1 if len(files) > 1 else 1, text)
        self.prune()

    def prune(self) -> None:
        """Keep the baseline and the newest `keep` applied states."""
        files = self._files()
        for f in files[1:-self.keep]:
            f.unlink()

    def pop(self) -> None:
        """Drop the newest applied state (never the baseline)."""
        files = self._files()
        if len(files) > 1:
            files[-1].unlink()


def merge_baseline(base: HostState, add: HostState) -> HostState:
    """Keep the first-seen original value of each sysctl and link attribute."""
    links = {i.name: i for i in base.interfaces}
    for i in add.interfaces:
        old = links.get(i.name)
        links[i.name] = Interface(
            name=i.name,
            mtu=old.mtu if old and old.mtu is not None else i.mtu,
            up=old.up if old and old.up is not None else i.up,
        )
    rp = {**add.sysctl.rp_filter, **base.sysctl.rp_filter}
    fwd = base.sysctl.ip_forward if base.sysctl.ip_forward is not None else add.sysctl.ip_forward
    mp = base.sysctl.multipath_hash_policy
    mp = mp if mp is not None else add.sysctl.multipath_hash_policy
    return HostState(interfaces=list(links.values()), sysctl=Sysctl(
        ip_forward=fwd, rp_filter=rp, multipath_hash_policy=mp))


def with_baseline(state: HostState, base: HostState) -> HostState:
    """`state`, with the baseline's values for sysctls and link attributes it does not set."""
    ifaces = {i.name: i for i in state.interfaces}
    for b in base.interfaces:
        i = ifaces.get(b.name)
        if i is None:
            ifaces[b.name] = b
        else:
            ifaces[b.name] = i.model_copy(update={
                "mtu": i.mtu if i.mtu is not None else b.mtu,
                "up": i.up if i.up is not None else b.up})
    return state.model_copy(update={"interfaces": list(ifaces.values()),
                                    "sysctl": sysctl_with_baseline(state.sysctl, base.sysctl)})


def sysctl_with_baseline(sysctl: Sysctl, base: Sysctl, rp_filter: bool = True) -> Sysctl:
    """`sysctl`, with the baseline's value for each sysctl it does not set (`rp_filter` False:
    the per-interface ones stay as they are)."""
    fwd, mp = sysctl.ip_forward, sysctl.multipath_hash_policy
    return Sysctl(ip_forward=fwd if fwd is not None else base.ip_forward,
                  rp_filter={**base.rp_filter, **sysctl.rp_filter} if rp_filter
                  else dict(sysctl.rp_filter),
                  multipath_hash_policy=mp if mp is not None else base.multipath_hash_policy)
