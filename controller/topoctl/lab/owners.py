"""Which process a lab belongs to, so that labs of a killed test or benchmark can be found.

A lab built by a person (`topoctl lab up`) lives until `topoctl lab down`. A lab built by a
program for the length of its run (a test, `bench.demo`, `bench.planner.lab_check`) is taken
down by that program, unless it is killed first (SIGKILL, a timeout, a closed terminal): then
its namespaces, cables, sshds and CPU groups stay behind. Such a program sets
$TOPOCTL_LAB_OWNER to its pid (`claim`); every lab built while it is set (in the program or in
the `topoctl lab up` it starts) records that pid and the process's start time in
/run/topoctl/lab-owners/<lab>. A lab whose owner is gone is an orphan (`orphans`), and
`topoctl lab down --orphans` removes them all; the test suite does at its start.

The start time tells a live owner from a new process that reuses its pid. /run is a tmpfs,
cleared at boot together with the namespaces, so a record never outlives its lab for long.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["OWNER_ENV", "claim", "forget", "orphans", "owner", "record", "recorded"]

OWNER_ENV = "TOPOCTL_LAB_OWNER"
OWNERS_DIR = Path("/run/topoctl/lab-owners")


def claim(pid: int | None = None) -> None:
    """Make labs built from now on by this process and its children belong to `pid` (default:
    this process), unless an owner is set already (a benchmark run by a test keeps the test's)."""
    os.environ.setdefault(OWNER_ENV, str(os.getpid() if pid is None else pid))


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (/proc/PID/stat field 22), None when
    no such process exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields after its last ')'
    return int(stat.rsplit(")", 1)[1].split()[19])


def record(lab: str, root: Path = OWNERS_DIR) -> int | None:
    """Record $TOPOCTL_LAB_OWNER as the owner of `lab` (nothing when it is unset or not a live
    pid); the pid recorded, or None."""
    value = os.environ.get(OWNER_ENV, "")
    if not value.isdigit():
        return None
    pid = int(value)
    started = _start_time(pid)
    if started is None:
        return None
    root.mkdir(parents=True, exist_ok=True)
    (root / lab).write_text(f"{pid} {started}\n")
    return pid


def owner(lab: str, root: Path = OWNERS_DIR) -> tuple[int, bool] | None:
    """(owner pid, whether that process still runs) of `lab`, or None for a lab without an
    owner (built by a person) or with an unreadable record."""
    try:
        pid, started = (int(x) for x in (root / lab).read_text().split())
    except (OSError, ValueError):
        return None
    return pid, _start_time(pid) == started


def recorded(root: Path = OWNERS_DIR) -> list[str]:
    """Every lab with an owner record (also one whose `up` was killed before it created
    anything a lab list would find)."""
    return sorted(p.name for p in root.glob("*")) if root.is_dir() else []


def orphans(labs: list[str], root: Path = OWNERS_DIR) -> list[str]:
    """The labs of `labs` whose owner has exited."""
    return [lab for lab in labs if (o := owner(lab, root)) is not None and not o[1]]


def forget(lab: str, root: Path = OWNERS_DIR) -> None:
    """Drop `lab`'s owner record (the lab is gone)."""
    (root / lab).unlink(missing_ok=True)
