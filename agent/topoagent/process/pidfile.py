"""The launcher's pid file (`RUN_DIR/job.pids`): which process groups `topo-agent stop` may
signal, each checked against the process before any signal.

A pid alone names whatever process has that number now: after a launcher killed with -9 the
number can belong to a bystander. Each line therefore holds a rank's pid and its start time
(field 22 of /proc/PID/stat, clock ticks since boot); a process counts as the rank only while
both match. A file that cannot be parsed is reported (`PidFileError`) and never acted on."""

from __future__ import annotations

import os
from pathlib import Path

from topoagent.protocol import TopoError


class PidFileError(TopoError, RuntimeError):
    """The pid file is not one a launcher wrote (garbage, truncated, from an older format)."""


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot), None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])  # field 22; fields[0] is field 3
    except (IndexError, ValueError):
        return None


def write_pids(path: Path, pids: list[int]) -> None:
    """Record `pids` with their start times, readable by root only, replacing the file at once
    (a reader never sees half of it)."""
    lines = "".join(f"{pid} {start_time(pid) or 0}\n" for pid in pids)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(lines)
    os.replace(tmp, path)


def read_pids(path: Path) -> list[tuple[int, int]]:
    """The (pid, start time) pairs of the file; [] when there is no file. PidFileError naming
    the file when it is not what `write_pids` writes."""
    try:
        text = path.read_bytes()[:65536].decode("ascii")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise PidFileError(f"unreadable pid file ({e.__class__.__name__})", source=str(path)
                           ) from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) < 2:
            raise PidFileError(f"line {n}: expected `PID STARTTIME`, got {line[:60]!r}",
                               source=str(path))
        out.append((int(parts[0]), int(parts[1])))
    return out


def live(entries: list[tuple[int, int]]) -> list[int]:
    """The pids of `entries` that still belong to the process recorded (same start time)."""
    return [pid for pid, start in entries if start and start_time(pid) == start]
