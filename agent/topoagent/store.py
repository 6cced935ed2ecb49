"""The agent's memory on disk: the history of applied states, newest last.

history/0000.json is the baseline: the values of every sysctl and link attribute the agent has
ever changed, as they were before it first changed them (and no addresses, routes, rules or
QoS). Each successful apply appends the desired state; rollback re-applies the one before the
newest and drops the newest. One directory per target, so many namespaces never collide.
Files are JSON (which is YAML too): a 1,000-route state writes and reads in milliseconds."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from topoagent.protocol import TopoError
from topoagent.state import HostState, Interface, Sysctl, parse_host_state


def _load(path: Path) -> HostState:
    return parse_host_state(json.loads(path.read_text()), prefix=str(path))


def _text(state: HostState) -> str:
    return json.dumps(state.to_dict()) + "\n"  # no indent: the C encoder


class StoreBusy(TopoError, RuntimeError):
    """Another topo-agent holds the store's lock (an apply or rollback is running)."""


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.dir = self.root / "history"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One apply or rollback at a time per target; a second one fails at once instead of
        interleaving its operations with the first."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreBusy(f"another topo-agent is applying to this target "
                                f"(lock {self.root / 'lock'})") from None
            yield

    def _files(self) -> list[Path]:
        return sorted(self.dir.glob("[0-9][0-9][0-9][0-9].json")) if self.dir.exists() else []

    def last_applied(self) -> HostState | None:
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

    def _write(self, n: int, text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{n:04d}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / f"{n:04d}.json")  # atomic: a crash leaves old or new

    def push(self, desired: HostState, baseline_additions: HostState) -> None:
        files = self._files()
        if not files or baseline_additions != HostState():
            base = _load(files[0]) if files else HostState()
            self._write(0, _text(merge_baseline(base, baseline_additions)))
        text = _text(desired)
        if len(files) > 1 and files[-1].read_text() == text:
            return  # re-applying the same state does not grow the history
        self._write(int(files[-1].stem) + 1 if len(files) > 1 else 1, text)

    def pop(self) -> None:
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
    return HostState(interfaces=list(links.values()), sysctl=Sysctl(ip_forward=fwd, rp_filter=rp))


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
    fwd = state.sysctl.ip_forward
    sysctl = Sysctl(ip_forward=fwd if fwd is not None else base.sysctl.ip_forward,
                    rp_filter={**base.sysctl.rp_filter, **state.sysctl.rp_filter})
    return state.model_copy(update={"interfaces": list(ifaces.values()), "sysctl": sysctl})
