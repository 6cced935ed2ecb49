"""`topo-agent watch`: the reconcile loop.

Every `interval` seconds: read the last applied state from the store, observe the host, diff.
No difference: "in sync". A difference is drift (someone deleted a route, a link went down, a
qdisc was replaced): it is written to the status file and, with `repair`, the last applied state
is applied again (the same transaction as `apply`: all or nothing, under the store's lock, so a
concurrent `apply` or `rollback` is never interleaved; a busy lock skips the round).

The status file (JSON, replaced atomically, default `<state dir>/watch.json`) is what
monitoring, `topoctl status` users and the systemd unit's operators read:
  {"status": "in sync" | "drifted" | "repaired" | "idle" | "busy" | "error",
   "time": unix seconds, "rounds": n, "drift": [operation descriptions],
   "repaired": [operations], "error": message, "applied": history file of the desired state}
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from topoagent.apply.mgmt import Mgmt
from topoagent.apply.store import Store, StoreBusy
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
        desired = store.last_applied()
        if desired is None:
            return Round("idle")
        _, ops = plan(target, desired, mgmt)
        drift = [op.describe() for op in ops]
        if not ops or not repair:
            return Round("drifted" if ops else "in sync", drift)
        with store.lock():
            result = apply_state(target, desired, probe=False, store=store, mgmt=mgmt)
        return Round("repaired", drift, [op.describe() for op in result.ops])
    except StoreBusy:
        return Round("busy")
    except (TopoError, ApplyError, TargetError, OSError, ValueError) as e:
        return Round("error", error=str(e))


def write_status(path: Path, rnd: Round, rounds: int) -> None:
    """Write the round's status JSON to `path` atomically."""
    doc = {"status": rnd.status, "time": round(time.time(), 3), "rounds": rounds,
           "drift": rnd.drift, "repaired": rnd.repaired, "error": rnd.error}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, path)  # readers see the old or the new status, never half of one


def watch(target: Target, *, interval: float = 30.0, repair: bool = False, once: bool = False,
          status_file: Path | None = None, mgmt: Mgmt | None = None,
          max_rounds: int | None = None) -> Round:
    """Loop until stopped (SIGTERM from systemd ends the process), or one round with `once`.
    Returns the last round."""
    store = Store(target.store_dir)
    path = status_file or target.store_dir / "watch.json"
    rounds = 0
    while True:
        rnd = check_once(target, store, repair=repair, mgmt=mgmt)
        rounds += 1
        write_status(path, rnd, rounds)
        if once or (max_rounds is not None and rounds >= max_rounds):
            return rnd
        time.sleep(interval)
