"""Crash safety: a transaction's undo log on disk, replayed by the next agent start.

Before an apply (or rollback) changes anything it writes `<state dir>/journal`: a header with
the host as it was (every object the diff looks at, with its ownership mark) and the history's
newest entry number, then, before each operation, one line with that operation's exact inverse
(the inverse carries the value it restores: the old MTU, sysctl, route, class...). Every line
is fsynced before the kernel is asked to change anything, so after a kill -9 or a power loss
the journal names every change that may have happened.

The history and the journal agree after any crash: an apply writes its history entry, then a
`commit` line, then prunes old entries and deletes the journal (a rollback writes the commit
line, then drops its entry). A journal without the commit line means the transaction did not
happen: recovery puts the host back to the header's snapshot and drops every history entry
after the header's newest. A journal with it means it did: recovery keeps the host and finishes
the history change. No journal: the newest history entry is the state the host was last made to
match. Pruning only ever happens after the commit, so a full history rewinds as well as a fresh
one.

`recover` (run by every agent start, by `topo-agent recover`, by each round of `watch`) finds
an unfinished journal and, before the commit line, takes the host back: the inverses newest
first (each tolerant: the last one may never have reached the kernel), routes the kernel
dropped as a side effect put back with their original protocol, then a diff against the
header's state for anything left, then a check. A journal that cannot be read (a corrupt
header, a damaged line before the last) is kept and named (JournalError, exit 1): without its
header nobody knows what the host was.

Test-only switch (never set in production): TOPO_AGENT_CRASH_AFTER=k makes the agent die right
after operation k (0: after the journal header, before any operation; len(ops)+1: after the
history entry is written, before the commit line; len(ops)+2: after the commit line, before
the journal is deleted); TOPO_AGENT_CRASH_MODE=kill (SIGKILL itself, the default) or raise (an
exception, which the apply reverts in process); TOPO_AGENT_CRASH_TARGET=NETNS limits the switch
to the agent acting on that namespace (one host of a lab dies, the others do not)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from topoagent.apply import kernel_ops, ovs
from topoagent.apply.batch import execute
from topoagent.apply.diff import diff
from topoagent.apply.kernel_ops import Driver, Op, SetRoute
from topoagent.apply.store import (
    Store,
    StoreError,
    fsync_dir,
    open_dir,
    opened,
    read_file,
    remove_file,
    with_baseline,
)
from topoagent.drivers.netlink import NetlinkDriver
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
    """The operation `op_to_json` wrote; JournalError for an unknown operation (KeyError,
    TypeError or ValueError for a record that is not one)."""
    if not isinstance(d, dict) or not isinstance(d.get("op"), str):
        raise TypeError(f"not an operation record: {str(d)[:80]}")
    for module in _OP_MODULES:
        cls = getattr(module, d["op"], None)
        if isinstance(cls, type) and issubclass(cls, Op):
            return cls(**{k: _dec(v) for k, v in d.items() if k != "op"})
    raise JournalError(f"journal: unknown operation {d['op']!r}")


# --- writing -------------------------------------------------------------------------------------
class Journal:
    """The undo log of one transaction; `begin` before the first change, `record` before each,
    `commit` once the host is in the new state and the history entry is written, `finish`
    after the history's own change (prune, or the rolled-back entry dropped)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / JOURNAL
        self._f = None
        self._dfd: int | None = None
        self._n = 0

    def begin(self, before: Observed, history: dict | None = None) -> None:
        """Write and fsync the header (the host as it was, and `history`: {"newest": the
        newest history entry now, "pop": an entry the transaction drops at its end}) before
        the first change. StoreError when the directory cannot take it (nothing changed)."""
        header = {
            "journal": 2, "pid": os.getpid(), "started": time.time(), "history": history,
            "before": to_host_state(before).to_dict(),
            "routes": [{"route": _enc(o.route), "proto": o.proto} for o in before.routes.values()],
        }
        self._dfd = open_dir(self.root, create=True)
        assert self._dfd is not None
        try:
            fd = os.open(JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_APPEND | os.O_CLOEXEC, 0o600, dir_fd=self._dfd)
        except FileExistsError:
            self.close()
            raise StoreError(f"{self.path}: an unfinished apply's journal is there: run "
                             "`topo-agent recover` first") from None
        except OSError as e:
            self.close()
            raise StoreError(f"{self.path}: cannot write it: {e.strerror}") from None
        self._f = os.fdopen(fd, "w")
        try:
            self._line(header)
        except StoreError:
            self.finish()  # nothing changed yet: the header never counted
            raise
        fsync_dir(self._dfd)  # the file's existence survives a power loss too

    def record(self, op: Op) -> None:
        """Log the inverse of `op` (the original values) before `op` runs."""
        self.record_all([op])

    def record_all(self, ops: list[Op]) -> None:
        """Log the inverses of `ops` (one fsync) before any of them runs (a batch)."""
        lines = []
        for op in ops:
            self._n += 1
            lines.append({"n": self._n, "undo": op_to_json(op.inverse())})
        self._line(*lines)

    def commit(self) -> None:
        """The host is in the new state and the history entry is written: from this line on
        recovery completes the transaction's history change instead of undoing it."""
        self._line({"commit": True})

    def _line(self, *objs: dict) -> None:
        assert self._f is not None
        try:
            self._f.write("".join(json.dumps(o, separators=(",", ":")) + "\n" for o in objs))
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:  # a full disk: the operation this line announces never runs
            raise StoreError(f"{self.path}: cannot write it: {e.strerror}") from None

    def close(self) -> None:
        """Close the file, leaving the journal in place (for `recover`, or the next start)."""
        if self._f is not None:
            with contextlib.suppress(OSError):  # a write a full disk refused: already reported
                self._f.close()
            self._f = None
        if self._dfd is not None:
            os.close(self._dfd)
            self._dfd = None

    def finish(self) -> None:
        """The transaction ended (committed, or reverted in process): nothing to recover."""
        if self._dfd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(JOURNAL, dir_fd=self._dfd)
            fsync_dir(self._dfd)
        self.close()


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
    """What recovering an interrupted transaction did: when it started, operations undone,
    problems left, and whether it had committed (then the host keeps the new state)."""

    started: float
    undone: int
    problems: list[str]
    committed: bool = False
    note: str = ""  # a journal whose header could not be read: what was checked instead

    def describe(self) -> str:
        """One line saying what the recovery undid and what problems remain."""
        if self.note:
            return self.note
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.started))
        if self.committed:
            return (f"completed an apply interrupted at {when} UTC after its commit: the host "
                    "keeps the applied state, the history records it")
        text = (f"recovered an apply interrupted at {when} UTC: {self.undone} operations undone")
        if self.problems:
            return text + "; HOST DIFFERS FROM BEFORE: " + "; ".join(self.problems)
        return text + "; host is as before"


def pending(root: Path) -> bool:
    """Whether an unfinished transaction left a journal under `root` (a journal that is not a
    regular file counts too: recovery then names it)."""
    try:
        os.stat(Path(root) / JOURNAL, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError as e:  # a directory we may not enter: recovery names it
        return e.errno != errno.ENOENT
    return True


UNREADABLE = "__unreadable__"  # a header key of ours: why the header could not be read


@dataclasses.dataclass
class _Log:
    """A journal as read back: its header (None: it never reached the disk), the undo
    operations in the order they were logged, whether the commit line is there."""

    header: dict | None
    undo: list[Op]
    committed: bool


def _bad(path: Path, what: str) -> JournalError:
    return JournalError(f"{path}: {what}; the journal is kept: check the host against it and "
                        "remove it by hand")


def _read(data: bytes, path: Path) -> _Log:
    # the last piece without its newline is a line torn by a power loss: its operation never
    # started (each runs only after its line is fsynced); every complete line must be valid
    *lines, _torn = data.split(b"\n")
    log = _Log(None, [], False)
    for i, raw in enumerate(lines, 1):
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            obj = None
        if i == 1 and not isinstance(obj, dict):  # judged by `recover`, against the history
            log.header = {UNREADABLE: "its header (line 1) is not a JSON object"}
            continue
        if not isinstance(obj, dict):
            raise _bad(path, f"line {i} is not a JSON object")
        if log.header is None:
            log.header = obj
        elif obj.get("commit") is True:
            log.committed = True
        else:
            try:
                log.undo.append(op_from_json(obj["undo"]))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise _bad(path, f"line {i} is not an undo record ({type(e).__name__}: "
                           f"{str(e)[:80]})") from None
    return log


def _snapshot(header: dict, path: Path) -> tuple[HostState, list[tuple[Route, int]], dict]:
    """The header's host as it was, its routes with their protocol, its history note."""
    try:  # the host as observed (not a desired document: one IP on two links can be)
        before = HostState.model_validate(header["before"])
        routes = [(_dec(e["route"]), int(e["proto"])) for e in header["routes"]]
        if not all(isinstance(r, Route) for r, _ in routes):
            raise ValueError("a route entry is not a route")
        history = header.get("history") or {}
        if "history_len" in header and not history:  # written by an older agent
            history = {"count": header["history_len"]}
        if not isinstance(history, dict) or not all(
                isinstance(v, int) or v is None for v in history.values()):
            raise ValueError(f"history note {history!r}")
        float(header.get("started", 0.0))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _bad(path, f"unreadable header ({type(e).__name__}: {str(e)[:120]})") from None
    return before, routes, history


def read_log(store: Store) -> _Log | None:
    """The journal under the store's directory, checked (None when there is none)."""
    path = store.root / JOURNAL
    with opened(store.root, create=False) as dfd:
        data = None if dfd is None else read_file(dfd, JOURNAL, path)
    return None if data is None else _read(data, path)


def recover(target, store: Store) -> Recovery | None:
    """Finish an interrupted transaction under the store's directory (the caller holds the
    lock). Without its commit line: the host back to the header's snapshot, the history back
    to the header's newest entry. With it: the host stays, the history change completes (the
    rolled-back entry dropped, old entries pruned). JournalError for a journal that cannot be
    read (kept, named)."""
    log = read_log(store)
    if log is None:
        return None
    path = store.root / JOURNAL
    if log.header is None:  # empty or torn: killed before the header reached the disk?
        return _recover_headless(target, store, log, "it has no complete header (empty or torn)")
    if UNREADABLE in log.header:
        return _recover_headless(target, store, log, log.header[UNREADABLE])
    try:
        before, routes, history = _snapshot(log.header, path)
    except JournalError as e:
        return _recover_headless(target, store, log, str(e).split("; the journal")[0]
                                 .removeprefix(f"{path}: "))
    started = float(log.header.get("started", 0.0))
    if log.committed:
        complete_history(store, history)
        _drop(store)
        return Recovery(started, 0, [], committed=True)
    target.check()
    drv = NetlinkDriver(target)
    try:
        problems = restore(drv, list(reversed(log.undo)), before, routes)
    finally:
        drv.close()
    rewind_history(store, history)
    _drop(store)
    return Recovery(started, len(log.undo), problems)


def _recover_headless(target, store: Store, log: _Log, why: str) -> Recovery:
    """A journal whose header cannot be read does not say what the host was: the host is
    compared with the history's last committed state instead (`_last_committed`; with no
    applied state, nothing of the agent's and the baseline's values), the undo lines that can be
    read run first unless the journal committed, and the host is set to that state. Only
    when it then matches is the journal set aside (`journal.damaged.<ns>`, for the
    operator; an empty one on a host that matched is removed); otherwise JournalError
    naming what differs, the journal kept."""
    path = store.root / JOURNAL
    newest = store.newest()
    committed = _last_committed(store)
    target.check()
    drv = NetlinkDriver(target)
    try:
        found = _differences(committed, observe(target))
        undo = [] if log.committed else list(reversed(log.undo))
        problems = restore(drv, undo, committed, []) if found or undo else []
    finally:
        drv.close()
    entry = (f"history entry {newest}" if newest > 0
             else "no applied state: the host as the agent found it")
    if problems:
        raise _bad(path, f"{why}, so what the host was is unknown; the host differs from the "
                   f"last committed state ({entry}) and could not be set to it: "
                   + "; ".join(problems))
    empty = log.header is None and not log.undo
    kept = None if empty and not found else _set_aside(store)
    if kept is None:  # an empty journal and a host as committed: nothing to look at
        _drop(store)
    if log.committed:
        complete_history(store, {})
    said = ("the host matched it" if not found else
            f"{len(found)} difference(s) set to it ({'; '.join(found[:5])}"
            + ("; ..." if len(found) > 5 else "") + ")")
    return Recovery(time.time(), len(undo), [], committed=log.committed,
                    note=f"{path}: {why}: the host was compared with the last committed state "
                         f"({entry}): {said}"
                         + (f"; the journal was moved to {kept}" if kept else
                            "; the journal was removed"))


def _last_committed(store: Store) -> HostState:
    """The state the host was last made to match, with the baseline's original value for
    every sysctl and link attribute it leaves unsaid (as `Store.previous` gives a rollback):
    the values an unreadable transaction may have changed were saved there before it began."""
    base = store.baseline()
    last = store.last_applied() or HostState()
    return with_baseline(last, base) if base is not None else last


def _differences(state: HostState, obs: Observed) -> list[str]:
    return [op.describe() for op in diff(state, obs) if not isinstance(op, ovs.OVS_OPS)]


def _set_aside(store: Store) -> Path:
    """Rename the journal to journal.damaged.<ns> (kept for the operator, no longer a
    transaction to recover); its new path."""
    name = f"{JOURNAL}.damaged.{time.time_ns()}"
    with opened(store.root, create=False) as dfd:
        assert dfd is not None
        try:
            os.rename(JOURNAL, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            raise StoreError(f"{store.root / JOURNAL}: cannot move it aside: "
                             f"{e.strerror}") from None
        fsync_dir(dfd)
    return store.root / name


def rewind_history(store: Store, history: dict) -> None:
    """The history as it was when the journal began: entries after its newest dropped, an
    entry an unfinished rollback renamed aside (`Store.retire`) back."""
    if history.get("newest") is not None:
        store.unretire(history["newest"])
        store.truncate(history["newest"])
    elif history.get("count") is not None:  # an older agent's journal: a count of entries
        nums, keep = store.numbers(), max(history["count"], 1)
        if len(nums) > keep:
            store.truncate(nums[keep - 1])


def complete_history(store: Store, history: dict) -> list[str]:
    """The committed transaction's history change: its rolled-back entry dropped (renamed aside
    before the commit, `Store.retire`; an older agent's journal: dropped now), then the oldest
    applied states beyond `keep` pruned. Returns warnings: garbage that could not be deleted
    (the history itself is right), also printed on stderr."""
    if history.get("pop") is not None:
        store.retire(history["pop"])  # already done unless an older agent wrote the journal
    warnings = store.purge_retired() + store.prune()
    for w in warnings:
        print(f"topo-agent: warning: {w}", file=sys.stderr, flush=True)
    return warnings


def _drop(store: Store) -> None:
    with opened(store.root, create=False) as dfd:
        if dfd is not None:
            remove_file(dfd, JOURNAL, store.root / JOURNAL)
            fsync_dir(dfd)


def restore(drv: Driver, undo: list[Op], before: HostState,
            routes: list[tuple[Route, int]]) -> list[str]:
    """Take the host back to `before`: run `undo` (inverses, newest change first), then put
    back routes the kernel dropped on its own (with their original protocol), then whatever a
    diff against `before` still finds. Returns what still differs (empty: exactly as before).

    Each step tolerates errors: after a crash the newest inverse may undo a change that never
    reached the kernel, and an inverse may need a later one first (a route's preferred source
    address comes back after the route); the final diff settles both, and decides."""
    # a route the crashed apply deleted goes back (its inverse replaces) unless a route the
    # agent cannot express took its key meanwhile: that one is someone else's, and the diff
    # below never replaces it either
    opaque = observe(drv.target).opaque_routes.keys()
    undo = [op for op in undo if not (isinstance(op, SetRoute) and op.old is None
                                      and op.route.key in opaque)]
    # refusals are retried below, then judged by the diff
    failed = [f.op for f in execute(drv, undo, [], stop=False)]
    execute(drv, failed, [], stop=False)
    now = observe(drv.target)
    # a key held now by a route of someone else (one the agent cannot express included) stays
    # theirs: putting ours back would replace it
    held = now.routes.keys() | now.opaque_routes.keys()
    execute(drv, [SetRoute(route, proto) for route, proto in routes if route.key not in held],
            [], stop=False)

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
        execute(drv, ops, [], stop=False)
    return [op.describe() for op in left()]
