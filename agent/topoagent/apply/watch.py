"""`topo-agent watch`: the reconcile loop.

Every `interval` seconds: finish what a killed writer left (a journal: topoagent.apply.journal;
an unconfirmed apply whose watchdog is gone, past its deadline: topoagent.apply.confirm), read
the last applied state from the store, observe the host, diff. No difference: "in sync". A
difference is drift (someone deleted a route, a link went down, a qdisc was replaced): it is
written to the status file and, with `repair`, the last applied state is applied again. The
repair takes the host's lock first and reads the last applied state again under it (an apply
may have committed a newer one since the unlocked look): the same transaction as `apply`, all
or nothing, never interleaved with an `apply`, `rollback` or `confirm`; a busy lock, or a
journal of a writer still running, skips the round ("busy"). While a confirmation is pending
the loop also wakes at its deadline.

The status file (JSON, replaced atomically, default `<state dir>/watch.json`) is what
monitoring, `topoctl status` users and the systemd unit's operators read:
  {"status": "in sync" | "drifted" | "repaired" | "idle" | "busy" | "error",
   "time": unix seconds, "rounds": n, "drift": [operation descriptions],
   "repaired": [operations], "error": message, "recovered": what this round finished of a
   killed writer ("" when nothing)}
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from topoagent.apply import confirm as confirming
from topoagent.apply import journal
from topoagent.apply.mgmt import Mgmt
from topoagent.apply.store import (
    DEFAULT_KEEP,
    Store,
    StoreBusy,
    StoreError,
    open_dir,
    write_file,
)
from topoagent.apply.transaction import ApplyError, apply_state, plan
from topoagent.protocol import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, TopoError
from topoagent.target import Target, TargetError


@dataclass
class Round:
    """One observe/diff (and maybe repair) pass."""

    status: str  # in sync | drifted | repaired | idle | busy | error
    drift: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    error: str = ""
    recovered: str = ""

    @property
    def exit_code(self) -> int:
        """The round's outcome: EXIT_OK in sync or idle, EXIT_CHANGES drifted or repaired (the
        exit code 2 with --detailed-exitcode, else 0: `topoagent.cliutil.run_verb`),
        EXIT_ERROR error."""
        if self.status == "error":
            return EXIT_ERROR
        return EXIT_CHANGES if self.status in ("drifted", "repaired") else EXIT_OK


def check_once(target: Target, store: Store, *, repair: bool = False,
               mgmt: Mgmt | None = None) -> Round:
    """Diff the host against the last applied state; with `repair`, re-apply it."""
    try:
        recovered = _finish_killed_writers(target, store)
        if journal.pending(store.root):  # a writer is running: its journal is live
            return Round("busy", recovered=recovered)
        desired = store.last_applied()
        if desired is None:
            return Round("idle", recovered=recovered)
        _, ops = plan(target, desired, mgmt)
        drift = [op.describe() for op in ops]
        if not ops or not repair:
            return Round("drifted" if ops else "in sync", drift, recovered=recovered)
        with store.lock():
            # again under the lock: an apply may have committed a newer state since the look
            # above, and repairing to the state read then would undo it
            desired = store.last_applied()
            if desired is None:
                return Round("idle", recovered=recovered)
            result = apply_state(target, desired, probe=False, store=store, mgmt=mgmt)
        if not result.ops:
            return Round("in sync", recovered=recovered)
        return Round("repaired", drift, [op.describe() for op in result.ops],
                     recovered=recovered)
    except StoreBusy:
        return Round("busy")
    except (TopoError, ApplyError, TargetError, OSError, ValueError) as e:
        return Round("error", error=str(e))


def _finish_killed_writers(target: Target, store: Store) -> str:
    """What every agent start does, once per round (a writer killed while the loop runs): an
    abandoned journal replayed, an unconfirmed apply whose watchdog is gone reverted after its
    deadline. Returns what was done ("" nothing)."""
    done = []
    if journal.pending(store.root):
        try:
            with store.lock():
                rec = journal.recover(target, store)
        except StoreBusy:  # its writer still runs
            rec = None
        if rec is not None:
            done.append(rec.describe())
    gone = confirming.expired_orphan(target, store)
    if gone is not None:
        done.append(f"reverted an unconfirmed apply: {gone['reason']}")
    return "; ".join(done)


def write_status(path: Path, rnd: Round, rounds: int, store_root: Path | None = None) -> None:
    """Write the round's status JSON to `path` atomically (a new temporary file, never one a
    symlink points to, renamed over it)."""
    doc = {"status": rnd.status, "time": round(time.time(), 3), "rounds": rounds,
           "drift": rnd.drift, "repaired": rnd.repaired, "error": rnd.error,
           "recovered": rnd.recovered}
    try:  # the state directory is checked (ours, 0700); a --status-file's is the operator's
        if path.parent == store_root:
            dfd = open_dir(path.parent, create=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise StoreError(f"{path.parent}: {e.strerror}") from None
    assert dfd is not None
    try:  # readers see the old or the new status, never half of one
        write_file(dfd, path.name, (json.dumps(doc) + "\n").encode(), path)
    finally:
        os.close(dfd)


def _pause(store: Store, interval: float) -> float:
    """Seconds until the next round: `interval`, or less to be there at the deadline of a
    pending confirmation (its watchdog may be gone)."""
    try:
        doc = confirming.pending(store.root)
    except TopoError:
        return interval
    if doc is None:
        return interval
    left = doc["deadline"] - time.time()
    return min(interval, left + 0.2 if left > -0.2 else 1.0)


def watch(target: Target, *, interval: float = 30.0, repair: bool = False, once: bool = False,
          status_file: Path | None = None, mgmt: Mgmt | None = None,
          max_rounds: int | None = None, keep: int = DEFAULT_KEEP) -> Round:
    """Loop until stopped (SIGTERM from systemd ends the process), or one round with `once`.
    Returns the last round. `keep`: applied states a repair's history keeps."""
    store = Store(target.store_dir, keep=keep, target=target)
    path = status_file or target.store_dir / "watch.json"
    rounds = 0
    while True:
        rnd = check_once(target, store, repair=repair, mgmt=mgmt)
        rounds += 1
        write_status(path, rnd, rounds, store.root)
        if once or (max_rounds is not None and rounds >= max_rounds):
            return rnd
        time.sleep(_pause(store, interval))
