"""Confirm-or-revert: an apply that undoes itself unless its controller confirms it in time.

`topo-agent apply --confirm-within SECONDS` applies as usual, then records the pending
confirmation in `<state dir>/confirm.json` (fsynced, 0600) and starts a watchdog: a detached
`topo-agent` process in its own session (it outlives the SSH connection that started it). Unless
`topo-agent confirm` arrives before the deadline, the watchdog takes the store lock and rolls the
host back to the state before that apply (as `topo-agent rollback` would, the management guard
off: the revert restores the path the apply may have broken), like `netplan try` and nmstate's
timed rollback. A controller that can still reach the host after the apply confirms it; a
host the apply cut off reverts by itself.

What is guaranteed:
- `confirm` succeeds only before the deadline, under the store lock; after it the host stays.
- A confirmation that comes too late reverts at once (if the watchdog has not yet) and says so.
- While a confirmation is pending another apply is refused (one pending confirmation at a
  time, as nmstate allows one); `rollback` reverts it now and ends the pending confirmation.
- If the watchdog itself dies (kill -9, reboot), the next agent start after the deadline (any
  verb, or `topo-agent recover`) reverts, so an unconfirmed apply never becomes permanent.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from topoagent.apply.store import Store, StoreBusy
from topoagent.apply.transaction import apply_state
from topoagent.protocol import TopoError

CONFIRM = "confirm.json"
LOG = "confirm.log"
POLL_S = 0.1


class ConfirmError(TopoError):
    """Nothing to confirm, a confirmation too late, or a second pending apply."""


def read(root: Path) -> dict | None:
    """The confirmation record in `root`, or None when there is none (or it is unreadable)."""
    try:
        doc = json.loads((Path(root) / CONFIRM).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write(root: Path, doc: dict) -> None:
    """Atomic and fsynced: a crash leaves the old record or the new one."""
    root = Path(root)
    tmp = root / f".{CONFIRM}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / CONFIRM)
    dfd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def clear(root: Path) -> None:
    """A plain apply: whatever the last confirmation's outcome was no longer matters."""
    with contextlib.suppress(FileNotFoundError):
        (Path(root) / CONFIRM).unlink()


def pending(root: Path) -> dict | None:
    """The record of an apply still waiting for `topo-agent confirm`, else None."""
    doc = read(root)
    return doc if doc is not None and doc.get("state") == "pending" else None


def _when(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def refuse_if_pending(root: Path) -> None:
    """Called (under the store lock) before an apply: one pending confirmation at a time."""
    doc = pending(root)
    if doc is not None:
        raise ConfirmError(
            f"an apply awaits confirmation until {_when(doc['deadline'])}: run `topo-agent "
            f"confirm` to keep it or `topo-agent rollback` to undo it before applying again")


def arm(root: Path, seconds: float, history_len: int) -> dict:
    """Record the pending confirmation (before the watchdog exists: if this process dies now,
    the next agent start after the deadline reverts)."""
    now = time.time()
    doc = {"state": "pending", "token": secrets.token_hex(8), "armed": now,
           "deadline": now + seconds, "seconds": seconds, "history_len": history_len,
           "watchdog": None}
    write(root, doc)
    return doc


def spawn_watchdog(root: Path, doc: dict, agent_args: list[str]) -> int:
    """Start the detached watchdog (`topo-agent <agent_args> confirm-watchdog TOKEN`): its own
    session, no inherited descriptors, output to <state dir>/confirm.log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_AGENT_CRASH")}
    fd = os.open(Path(root) / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        p = subprocess.Popen([sys.executable, "-m", "topoagent.cli", *agent_args,
                              "confirm-watchdog", doc["token"]],
                             stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd="/", env=env,
                             start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    write(root, doc | {"watchdog": p.pid})
    return p.pid


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own child, not yet reaped) is not waiting for anything
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def revert(target, store: Store, doc: dict, why: str) -> dict:
    """Roll back the unconfirmed apply (the caller holds the store lock); the record says
    what happened. Raises ConfirmError if the history no longer matches the record."""
    if store.history_len() != doc["history_len"]:
        write(store.root, doc | {"state": "abandoned", "ended": time.time(),
                                 "reason": "the history changed since the apply"})
        raise ConfirmError("the history changed since the unconfirmed apply: not reverting; "
                           "check the host and roll back by hand")
    previous = store.previous()
    if previous is not None:
        apply_state(target, previous, probe=False, mgmt=None, journal_dir=store.root)
        store.pop()
    out = doc | {"state": "reverted", "ended": time.time(), "reason": why}
    write(store.root, out)
    return out


@contextlib.contextmanager
def _lock_waiting(store: Store, seconds: float = 30.0):
    """The store lock, waiting for a revert in progress (the watchdog holds it) to end."""
    end = time.monotonic() + seconds
    while True:
        try:
            with store.lock():
                yield
                return
        except StoreBusy:
            if time.monotonic() > end:
                raise
            time.sleep(POLL_S)


def confirm(target, store: Store) -> dict:
    """`topo-agent confirm`: keep the pending apply. ConfirmError when nothing is pending or
    the deadline has passed (then the apply is reverted, here if the watchdog has not yet)."""
    with _lock_waiting(store):
        doc = read(store.root)
        if doc is None:
            raise ConfirmError("nothing awaits confirmation (no apply with --confirm-within)")
        if doc["state"] == "reverted":
            raise ConfirmError(f"too late: the apply was reverted at {_when(doc['ended'])} "
                               f"({doc.get('reason', '')})")
        if doc["state"] != "pending":
            return doc  # confirmed already: confirming twice is harmless
        now = time.time()
        if now > doc["deadline"]:
            done = revert(target, store, doc, f"confirmation came {now - doc['deadline']:.1f} s "
                          "after the deadline")
            raise ConfirmError(f"too late: the deadline passed at {_when(doc['deadline'])}; "
                               f"the apply was reverted ({done['reason']})")
        out = doc | {"state": "confirmed", "ended": now}
        write(store.root, out)
        return out


def end_by_rollback(root: Path) -> None:
    """A rollback undid the pending apply: the watchdog has nothing left to do."""
    doc = pending(root)
    if doc is not None:
        write(root, doc | {"state": "rolled back", "ended": time.time()})


def watchdog(target, store: Store, token: str) -> int:
    """Wait for the deadline; revert unless the apply was confirmed (or rolled back) first."""
    while True:
        doc = pending(store.root)
        if doc is None or doc.get("token") != token:
            return 0
        left = doc["deadline"] - time.time()
        if left <= 0:
            break
        time.sleep(min(POLL_S, left))
    while True:
        try:
            with store.lock():
                doc = pending(store.root)
                if doc is None or doc.get("token") != token:
                    return 0
                done = revert(target, store, doc, f"no confirmation within {doc['seconds']:g} s")
                print(f"topo-agent: reverted the apply of {_when(doc['armed'])}: "
                      f"{done['reason']}", file=sys.stderr)
                return 2
        except StoreBusy:
            time.sleep(POLL_S)


def expired_orphan(target, store: Store) -> dict | None:
    """At agent start: a pending confirmation past its deadline whose watchdog is gone (killed,
    or the machine rebooted) is reverted now. Returns the record if it reverted."""
    doc = pending(store.root)
    if doc is None or time.time() <= doc["deadline"] or _alive(doc.get("watchdog")):
        return None
    try:
        with store.lock():
            doc = pending(store.root)
            if doc is None:
                return None
            return revert(target, store, doc, f"no confirmation within {doc['seconds']:g} s "
                          "(the watchdog was gone; reverted at the next agent start)")
    except StoreBusy:
        return None
