"""Machine-wide locks, for steps that read something every process on the machine shares and
then change it: two such steps at once would each act on what the other is about to undo.

    with machine_lock("congestion"):
        ...  # read the allowed congestion controls, widen them, put them back

The lock is an flock on /run/lock/topoctl-NAME.lock (the temporary directory where /run/lock
is not writable), released when the block ends or the process dies. Not reentrant."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

RUN_LOCK = Path("/run/lock")


def lock_path(name: str) -> Path:
    """The file behind `machine_lock(name)`."""
    base = RUN_LOCK if os.access(RUN_LOCK, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"topoctl-{name}.lock"


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock `name` for the block (waiting for another holder)."""
    fd = os.open(lock_path(name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock
