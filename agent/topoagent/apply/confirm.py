"""Confirm-or-revert: an apply that undoes itself unless its controller confirms it in time.

`topo-agent apply --confirm-within SECONDS` applies as usual, then records the pending
confirmation in `<state dir>/confirm.json` (fsynced, 0600) and starts a watchdog: a detached
`topo-agent` process in its own session (it outlives the SSH connection that started it). Unless
`topo-agent confirm` arrives before the deadline, the watchdog takes the store lock and rolls the
host back to the state before that apply (as `topo-agent rollback` would, the management guard
off: the revert restores the path the apply may have broken), like `netplan try` and nmstate's
timed rollback. A controller that can still reach the host after the apply confirms it; a
host the apply cut off reverts by itself.

Reaching the host is not enough: a path shaped to 1 kbit/s still carries a small `confirm`.
So `confirm` keeps the apply only with a probe of real size through the management path
(`topoagent.apply.probe`): `topo-agent confirm-probe` sends PROBE_BYTES of random text to the
controller (its digest goes into the record), `topo-agent confirm --probe -` takes them back,
and the apply stays only when they came back whole within the probe's deadline. A probe back
too late reverts at once; without a probe `confirm` is refused (`--no-probe`: an operator at
the host's console).

What is guaranteed:
- `confirm` succeeds only before the deadline, under the store lock; after it the host stays.
- A confirmation that comes too late reverts at once (if the watchdog has not yet) and says so.
- While a confirmation is pending another apply is refused (one pending confirmation at a
  time, as nmstate allows one); `rollback` reverts it now and ends the pending confirmation.
- If the watchdog itself dies (kill -9, reboot), the next agent start after the deadline (any
  verb, or `topo-agent recover`) reverts, and so does a running `watch` loop (it wakes up at
  the deadline): an unconfirmed apply never becomes permanent. The record names the watchdog by
  pid, start time and boot id, so a pid reused by another process does not count as it.
- A record that is not one the agent wrote (torn, edited: no deadline, a NaN) is one error
  naming the file (exit 1) for every verb that would act on it; `show` and `diff` go on.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from topoagent.apply.probe import PROBE_BYTES, PROBE_WITHIN_S, probe_digest, probe_payload
from topoagent.apply.store import (
    Store,
    StoreBusy,
    StoreError,
    opened,
    parse_json,
    read_file,
    remove_file,
    write_file,
)
from topoagent.apply.transaction import rollback
from topoagent.protocol import TopoError

CONFIRM = "confirm.json"
LOG = "confirm.log"
POLL_S = 0.1


class ConfirmError(TopoError):
    """Nothing to confirm, a confirmation too late, or a second pending apply."""


STATES = ("pending", "confirmed", "reverted", "rolled back", "abandoned")
_NUMBERS = ("armed", "deadline", "seconds")


def _malformed(path: Path, what: str) -> StoreError:
    return StoreError(f"{path}: not a confirmation record of the agent: {what}; check the host "
                      "(`topo-agent rollback` undoes the apply it was for), then remove the file")


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_record(doc: object, path: Path) -> dict:
    """`doc` checked as a record `arm` and its successors write (a state, a token, finite
    times, the history entry, the watchdog's identity); StoreError naming `path` otherwise."""
    if not isinstance(doc, dict):
        raise _malformed(path, f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("state") not in STATES:
        raise _malformed(path, f"state {str(doc.get('state'))[:40]!r} is none of "
                         f"{', '.join(STATES)}")
    if not isinstance(doc.get("token"), str):
        raise _malformed(path, "no token")
    for key in _NUMBERS + (("ended",) if doc["state"] != "pending" else ()):
        if not _number(doc.get(key)):
            raise _malformed(path, f"{key} is not a finite number of seconds")
    if not (_integer(doc.get("newest")) or _integer(doc.get("history_len"))):
        raise _malformed(path, "no history entry (newest)")
    for key in ("watchdog", "watchdog_start"):
        if doc.get(key) is not None and not _integer(doc[key]):
            raise _malformed(path, f"{key} is not a whole number")
    probe = doc.get("probe")
    if probe is not None and not (
            isinstance(probe, dict) and isinstance(probe.get("digest"), str)
            and all(_number(probe.get(k)) for k in ("bytes", "within", "issued"))):
        raise _malformed(path, "probe is not {digest, bytes, within, issued}")
    return doc


def read(root: Path) -> dict | None:
    """The confirmation record in `root`, or None when there is none; StoreError naming the
    file when it is not a record of the agent (torn, edited, from elsewhere)."""
    root = Path(root)
    with opened(root, create=False) as dfd:
        data = None if dfd is None else read_file(dfd, CONFIRM, root / CONFIRM)
    if data is None:
        return None
    return parse_record(parse_json(data, root / CONFIRM), root / CONFIRM)


def write(root: Path, doc: dict) -> None:
    """Atomic and fsynced: a crash leaves the old record or the new one."""
    root = Path(root)
    with opened(root, create=True) as dfd:
        assert dfd is not None
        write_file(dfd, CONFIRM, (json.dumps(doc) + "\n").encode(), root / CONFIRM)


def clear(root: Path) -> None:
    """A plain apply: whatever the last confirmation's outcome was no longer matters."""
    root = Path(root)
    with opened(root, create=False) as dfd:
        if dfd is not None:
            remove_file(dfd, CONFIRM, root / CONFIRM)


def pending(root: Path) -> dict | None:
    """The record of an apply still waiting for `topo-agent confirm`, else None."""
    doc = read(root)
    return doc if doc is not None and doc["state"] == "pending" else None


def _when(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def refuse_if_pending(root: Path) -> None:
    """Called (under the store lock) before an apply: one pending confirmation at a time."""
    doc = pending(root)
    if doc is not None:
        raise ConfirmError(
            f"an apply awaits confirmation until {_when(doc['deadline'])}: run `topo-agent "
            f"confirm` to keep it or `topo-agent rollback` to undo it before applying again")


def arm(store: Store, seconds: float) -> dict:
    """Record the pending confirmation of the apply just committed (the newest history entry;
    before the watchdog exists: if this process dies now, the next agent start after the
    deadline reverts)."""
    now = time.time()
    doc = {"state": "pending", "token": secrets.token_hex(8), "armed": now,
           "deadline": now + seconds, "seconds": seconds, "newest": store.newest(),
           "watchdog": None}
    write(store.root, doc)
    return doc


def spawn_watchdog(root: Path, doc: dict, agent_args: list[str]) -> dict:
    """Start the detached watchdog (`topo-agent <agent_args> confirm-watchdog TOKEN`): its own
    session, no inherited descriptors, output to <state dir>/confirm.log. The record names it
    by pid, start time and boot (a later process with the same pid is not the watchdog);
    returns the record."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPO_AGENT_CRASH")}
    root = Path(root)
    with opened(root, create=True) as dfd:
        try:
            fd = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except OSError as e:
            raise StoreError(f"{root / LOG}: cannot write it: {e.strerror}") from None
    try:
        p = subprocess.Popen([sys.executable, "-m", "topoagent.cli", *agent_args,
                              "confirm-watchdog", doc["token"]],
                             stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, cwd="/", env=env,
                             start_new_session=True, close_fds=True)
    finally:
        os.close(fd)
    doc = doc | {"watchdog": p.pid, "watchdog_start": _proc(p.pid)[1], "boot": _boot_id()}
    write(root, doc)
    return doc


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _proc(pid: int) -> tuple[str, int | None]:
    """(state letter, start time in clock ticks since boot) of process `pid`; ("", None) when
    there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return "", None
    fields = stat.rpartition(")")[2].split()  # the name (field 2) may hold ") "
    try:
        return fields[0], int(fields[19])  # fields 3 and 22
    except (IndexError, ValueError):
        return "", None


def watchdog_alive(doc: dict) -> bool:
    """Whether the record's watchdog still runs: the same pid, started at the same tick of the
    same boot (a pid reused by another process is not it), not a zombie. A record of an older
    agent without the start time: the process's command line must hold the record's token."""
    pid = doc.get("watchdog")
    if not pid or pid < 2:
        return False
    if doc.get("boot") and doc["boot"] != _boot_id():
        return False  # the machine rebooted since
    state, start = _proc(pid)
    if start is None or state == "Z":  # a zombie (our child, not yet reaped) waits for nothing
        return False
    if doc.get("watchdog_start") is not None:
        return start == doc["watchdog_start"]
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return doc["token"].encode() in argv


def revert(target, store: Store, doc: dict, why: str) -> dict:
    """Roll back the unconfirmed apply (the caller holds the store lock), one journaled
    transaction; the record says what happened. Raises ConfirmError if the history's newest
    entry is no longer the apply's."""
    newest = doc.get("newest")
    same = (store.newest() == newest if newest is not None
            else store.history_len() == doc.get("history_len"))  # an older agent's record
    if not same:
        write(store.root, doc | {"state": "abandoned", "ended": time.time(),
                                 "reason": "the history changed since the apply"})
        raise ConfirmError("the history changed since the unconfirmed apply: not reverting; "
                           "check the host and roll back by hand")
    rollback(target, store, probe=False, mgmt=None)
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


def confirm(target, store: Store, proof: tuple[str, float] | None = None,
            unprobed: bool = False) -> dict:
    """`topo-agent confirm`: keep the pending apply. `proof`: the probe payload sent back and
    when it was all received (`probe.read_probe`); `unprobed`: keep it without one. ConfirmError
    when nothing is pending, the deadline has passed (then the apply is reverted, here if the
    watchdog has not yet), or the probe is missing, altered or too late (reverted at once)."""
    with _lock_waiting(store):
        doc = _pending_or_done(target, store)
        if doc["state"] != "pending":
            return doc  # confirmed already: confirming twice is harmless
        measured = None if unprobed else _check_probe(target, store, doc, proof)
        out = doc | {"state": "confirmed", "ended": time.time()}
        if measured is not None:
            out["probe"] = doc["probe"] | measured
        write(store.root, out)
        return out


def _pending_or_done(target, store: Store) -> dict:
    """The record (the caller holds the lock), pending and in time or already confirmed;
    ConfirmError otherwise (reverting an apply whose deadline passed)."""
    doc = read(store.root)
    if doc is None:
        raise ConfirmError("nothing awaits confirmation (no apply with --confirm-within)")
    if doc["state"] == "reverted":
        raise ConfirmError(f"too late: the apply was reverted at {_when(doc['ended'])} "
                           f"({doc.get('reason', '')})")
    now = time.time()
    if doc["state"] == "pending" and now > doc["deadline"]:
        done = revert(target, store, doc, f"confirmation came {now - doc['deadline']:.1f} s "
                      "after the deadline")
        raise ConfirmError(f"too late: the deadline passed at {_when(doc['deadline'])}; "
                           f"the apply was reverted ({done['reason']})")
    return doc


def issue_probe(target, store: Store, nbytes: int = PROBE_BYTES,
                within: float = PROBE_WITHIN_S) -> str:
    """`topo-agent confirm-probe`: a fresh random payload of `nbytes` for the controller to
    send back with `confirm --probe` within `within` seconds; its digest and the time go into
    the pending record (a new probe replaces the last). ConfirmError as `confirm`."""
    with _lock_waiting(store):
        doc = _pending_or_done(target, store)
        if doc["state"] != "pending":
            raise ConfirmError("the apply is confirmed already: nothing to probe for")
        payload = probe_payload(nbytes)
        write(store.root, doc | {"probe": {"digest": probe_digest(payload), "bytes":
                                           len(payload), "within": within,
                                           "issued": time.time()}})
    return payload


def _check_probe(target, store: Store, doc: dict, proof: tuple[str, float] | None) -> dict:
    """{bytes, seconds} of a good probe; ConfirmError for none, an altered one, or one back
    too late (the path is starved: revert now rather than at the deadline)."""
    issued = doc.get("probe")
    if proof is None:
        raise ConfirmError(
            "keeping this apply needs a probe of the management path: `topo-agent "
            "confirm-probe` sends its bytes to you, `topo-agent confirm --probe -` takes them "
            "back, over the same connection (`topoctl apply` does both; `--no-probe` confirms "
            "without, from the host's console); the apply reverts at its deadline otherwise")
    if not isinstance(issued, dict):
        raise ConfirmError("no probe was sent for this apply: run `topo-agent confirm-probe` "
                           "first and send its output back with `confirm --probe -`")
    text, received = proof
    if probe_digest(text) != issued["digest"]:
        raise ConfirmError(f"the probe came back altered ({len(text.strip())} bytes, "
                           f"{issued['bytes']} sent, or not the last probe): not confirmed")
    took = received - issued["issued"]
    if took > issued["within"]:
        done = revert(target, store, doc, f"the management path is too slow: the probe "
                      f"({issued['bytes']} bytes each way) took {took:.1f} s, more than "
                      f"{issued['within']:g} s")
        raise ConfirmError(f"{done['reason']}; the apply was reverted")
    return {"seconds": round(took, 3)}


def end_by_rollback(root: Path) -> None:
    """A rollback undid the pending apply: the watchdog has nothing left to do."""
    doc = pending(root)
    if doc is not None:
        write(root, doc | {"state": "rolled back", "ended": time.time()})


def watchdog(target, store: Store, token: str) -> int:
    """Wait for the deadline; revert unless the apply was confirmed (or rolled back) first.
    A record that turns unreadable meanwhile does not stop the revert: the deadline is the
    one read first."""
    known = None
    while True:
        doc = _still_pending(store, known)
        if doc is None or doc["token"] != token:
            return 0
        known = doc
        left = doc["deadline"] - time.time()
        if left <= 0:
            break
        time.sleep(min(POLL_S, left))
    while True:
        try:
            with store.lock():
                doc = _still_pending(store, known)
                if doc is None or doc["token"] != token:
                    return 0
                done = revert(target, store, doc, f"no confirmation within {doc['seconds']:g} s")
                print(f"topo-agent: reverted the apply of {_when(doc['armed'])}: "
                      f"{done['reason']}", file=sys.stderr)
                return 2
        except StoreBusy:
            time.sleep(POLL_S)


def _still_pending(store: Store, known: dict | None) -> dict | None:
    try:
        return pending(store.root)
    except StoreError as e:
        if known is None:
            raise
        print(f"topo-agent: {e}; reverting at the deadline read before", file=sys.stderr)
        return known


def expired_orphan(target, store: Store) -> dict | None:
    """A pending confirmation past its deadline whose watchdog is gone (killed, or the machine
    rebooted) is reverted now: at every agent start and every round of a long-running agent
    process (`watch`). Returns the record if it reverted."""
    doc = pending(store.root)
    if doc is None or time.time() <= doc["deadline"] or watchdog_alive(doc):
        return None
    try:
        with store.lock():
            doc = pending(store.root)
            if doc is None:
                return None
            return revert(target, store, doc, f"no confirmation within {doc['seconds']:g} s "
                          "(the watchdog was gone; reverted by the next agent to look)")
    except StoreBusy:
        return None
