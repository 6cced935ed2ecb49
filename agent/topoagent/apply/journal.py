"""Crash safety: an apply's undo log on disk, replayed by the next agent start.

Before an apply changes anything it writes `<state dir>/journal`: a header with the host as it
was (every object the diff looks at, with its ownership mark) and then, before each operation,
one line with that operation's exact inverse (the inverse carries the value it restores: the old
MTU, sysctl, route, class...). Every line is fsynced before the kernel is asked to change
anything, so after a kill -9 or a power loss the journal names every change that may have
happened. A finished apply (committed or reverted in process) deletes the journal.

`recover` (run by every agent start, and by `topo-agent recover`) finds an unfinished journal and
takes the host back to the header's state: the inverses newest first (each tolerant: the last
one may never have reached the kernel), routes the kernel dropped as a side effect put back with
their original protocol, then a diff against the header's state for anything left, then a check.
History entries written by the interrupted apply are dropped, so the history matches the host.

Test-only switch (never set in production): TOPO_AGENT_CRASH_AFTER=k makes the agent die right
after operation k (0: after the journal header, before any operation; len(ops)+1: after the
history is written, before the journal is closed); TOPO_AGENT_CRASH_MODE=kill (SIGKILL itself,
the default) or raise (an exception, which the apply reverts in process);
TOPO_AGENT_CRASH_TARGET=NETNS limits the switch to the agent acting on that namespace (one host
of a lab dies, the others do not)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from topoagent.apply import kernel_ops, ovs
from topoagent.apply.diff import diff
from topoagent.apply.kernel_ops import Driver, Op
from topoagent.drivers.ovsdb import BridgeConfig, DbConfig, PortConfig, PortQos
from topoagent.observe.host import Observed, observe, to_host_state
from topoagent.protocol import TopoError
from topoagent.state.host import HostState, QosClass, Route, Rule

JOURNAL = "journal"
_MODELS = {"Route": Route, "Rule": Rule, "QosClass": QosClass}


class SimulatedCrash(TopoError):
    """Raised by the test-only crash switch in `raise` mode."""


class JournalError(TopoError):
    """A journal that cannot be read or names an unknown operation."""

    pass


# --- operations as JSON --------------------------------------------------------------------------
# plain-data values inside OVS operations (frozen dataclasses, frozensets, dicts of them)
_DATA = {c.__name__: c for c in (PortQos, PortConfig, BridgeConfig, DbConfig)}
_OP_MODULES = (kernel_ops, ovs)


def _enc(v: Any) -> Any:
    if isinstance(v, (Route, Rule, QosClass)):
        return {"__model__": type(v).__name__,
                "data": v.model_dump(mode="json", by_alias=True, exclude_none=True)}
    if type(v).__name__ in _DATA and dataclasses.is_dataclass(v):
        return {"__data__": type(v).__name__,
                "data": {f.name: _enc(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, frozenset):
        return {"__frozenset__": sorted((_enc(x) for x in v), key=json.dumps)}
    if isinstance(v, dict):
        return {"__dict__": [[k, _enc(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return [_enc(x) for x in v]
    return v


def _dec(v: Any) -> Any:
    if isinstance(v, dict) and "__model__" in v:
        return _MODELS[v["__model__"]].model_validate(v["data"])
    if isinstance(v, dict) and "__data__" in v:
        return _DATA[v["__data__"]](**{k: _dec(x) for k, x in v["data"].items()})
    if isinstance(v, dict) and "__frozenset__" in v:
        return frozenset(_dec(x) for x in v["__frozenset__"])
    if isinstance(v, dict) and "__dict__" in v:
        return {k: _dec(x) for k, x in v["__dict__"]}
    if isinstance(v, list):
        return tuple(_dec(x) for x in v)
    return v


def op_to_json(op: Op) -> dict:
    """An operation as a JSON-ready dict (its class name and fields)."""
    return {"op": type(op).__name__,
            **{f.name: _enc(getattr(op, f.name)) for f in dataclasses.fields(op)}}


def op_from_json(d: dict) -> Op:
    """The operation `op_to_json` wrote; JournalError for an unknown operation."""
    for module in _OP_MODULES:
        cls = getattr(module, d["op"], None)
        if isinstance(cls, type) and issubclass(cls, Op):
            return cls(**{k: _dec(v) for k, v in d.items() if k != "op"})
    raise JournalError(f"journal: unknown operation {d['op']!r}")


# --- writing -------------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """The undo log of one apply; `begin` before the first change, `record` before each."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / JOURNAL
        self._f = None
        self._n = 0

    def begin(self, before: Observed, history_len: int | None = None) -> None:
        """Write and fsync the header (the host as it was) before the first change."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        header = {
            "journal": 1, "pid": os.getpid(), "started": time.time(),
            "history_len": history_len,
            "before": to_host_state(before).to_dict(),
            "routes": [{"route": _enc(o.route), "proto": o.proto} for o in before.routes.values()],
        }
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._f = os.fdopen(fd, "w")
        self._line(header)
        _fsync_dir(self.root)  # the file's existence survives a power loss too

    def record(self, op: Op) -> None:
        """Log the inverse of `op` (the original values) before `op` runs."""
        self._n += 1
        self._line({"n": self._n, "undo": op_to_json(op.inverse())})

    def _line(self, obj: dict) -> None:
        assert self._f is not None
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def finish(self) -> None:
        """The apply ended (committed, or reverted in process): nothing to recover."""
        if self._f is not None:
            self._f.close()
            self._f = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            _fsync_dir(self.root)


def crash_point(k: int) -> None:
    """The test-only crash switch (see the module docstring)."""
    want = os.environ.get("TOPO_AGENT_CRASH_AFTER")
    if want is None or not want.strip().lstrip("-").isdigit() or int(want) != k:
        return
    if os.environ.get("TOPO_AGENT_CRASH_MODE", "kill") == "raise":
        raise SimulatedCrash(f"simulated crash after operation {k} (TOPO_AGENT_CRASH_AFTER)")
    os.kill(os.getpid(), signal.SIGKILL)


# --- recovery ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Recovery:
    """What recovering an interrupted apply did: when it started, operations undone, problems
    left."""

    started: float
    undone: int
    problems: list[str]

    def describe(self) -> str:
        """One line saying what the recovery undid and what problems remain."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.started))
        text = (f"recovered an apply interrupted at {when} UTC: {self.undone} operations undone")
        if self.problems:
            return text + "; HOST DIFFERS FROM BEFORE: " + "; ".join(self.problems)
        return text + "; host is as before"


def pending(root: Path) -> bool:
    """Whether an unfinished apply left a journal under `root`."""
    return (Path(root) / JOURNAL).exists()


def _read(path: Path) -> tuple[dict | None, list[Op]]:
    header, undo = None, []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for raw in lines:
        try:
            obj = json.loads(raw)
        except ValueError:
            break  # a torn last line (power loss mid-write): that operation never started
        if header is None:
            header = obj
        else:
            undo.append(op_from_json(obj["undo"]))
    return header, undo


def recover(target, root: Path) -> Recovery | None:
    """Replay an unfinished journal under `root` (the caller holds the store lock)."""
    # pyroute2's request builders (~0.2 s) load only when a journal is there to replay
    from topoagent.drivers.netlink import NetlinkDriver

    path = Path(root) / JOURNAL
    if not path.exists():
        return None
    header, undo = _read(path)
    if header is None:  # killed before the header reached the disk: nothing was changed
        path.unlink()
        return Recovery(time.time(), 0, [])
    try:  # the host as observed (not a desired document: one IP on two links can be)
        before = HostState.model_validate(header["before"])
    except ValueError as e:
        raise JournalError(f"{path}: unreadable snapshot, recover by hand: {e}") from None
    routes = [(_dec(e["route"]), e["proto"]) for e in header["routes"]]
    with contextlib.closing(target.iproute()) as ipr:
        problems = restore(NetlinkDriver(target, ipr), list(reversed(undo)), before, routes)
    _truncate_history(Path(root), header.get("history_len"))
    path.unlink()
    _fsync_dir(Path(root))
    return Recovery(header.get("started", 0.0), len(undo), problems)


def restore(drv: Driver, undo: list[Op], before: HostState,
            routes: list[tuple[Route, int]]) -> list[str]:
    """Take the host back to `before`: run `undo` (inverses, newest change first), then put
    back routes the kernel dropped on its own (with their original protocol), then whatever a
    diff against `before` still finds. Returns what still differs (empty: exactly as before).

    Each step tolerates errors: after a crash the newest inverse may undo a change that never
    reached the kernel, and an inverse may need a later one first (a route's preferred source
    address comes back after the route); the final diff settles both, and decides."""
    failed = []
    for op in undo:
        try:
            op.apply(drv)
        except Exception:  # noqa: BLE001 - retried below, then judged by the diff
            failed.append(op)
    for op in failed:
        with contextlib.suppress(Exception):
            op.apply(drv)
    now = observe(drv.target).routes
    for route, proto in routes:
        if route.key not in now:
            with contextlib.suppress(Exception):
                drv.set_route(route, proto)
    def left() -> list[Op]:
        # a HostState snapshot does not carry the OVS rows, flows and filters (its diff would
        # delete them): those are put back by their inverses alone, which are exact (each
        # writes the whole old configuration of its bridge or port)
        return [op for op in diff(before, observe(drv.target))
                if not isinstance(op, ovs.OVS_OPS)]

    for _ in range(2):
        ops = left()
        if not ops:
            return []
        for op in ops:
            with contextlib.suppress(Exception):
                op.apply(drv)
    return [op.describe() for op in left()]


def _truncate_history(root: Path, history_len: int | None) -> None:
    if history_len is None:
        return
    files = sorted((root / "history").glob("[0-9][0-9][0-9][0-9].json"))
    for f in files[max(history_len, 1):]:
        f.unlink()
