"""Machine-wide locks (`topoagent.machinelock`): the read-then-change steps on what the whole
machine shares hold one while they run, so a second process (another `topoctl lab up`, another
test worker) waits instead of undoing the first one's change. Checked from another process, as
an independent reader: it cannot take the lock while the step is inside."""

from __future__ import annotations

import subprocess
import sys

import pytest

from topoagent.congestion import allowed_for_namespaces
from topoagent.machinelock import lock_path, machine_lock

pytestmark = pytest.mark.netns

_TRY = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n"
        "    print('held')\nelse:\n    print('free')")


def _state(name: str) -> str:
    """'held' or 'free': whether another process could take lock `name` now."""
    return subprocess.run([sys.executable, "-c", _TRY, str(lock_path(name))],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_machine_lock_is_held_for_its_block_only():
    assert _state("tpt-probe") == "free"
    with machine_lock("tpt-probe"):
        assert _state("tpt-probe") == "held"
    assert _state("tpt-probe") == "free"
    with pytest.raises(ValueError), machine_lock("tpt-probe"):
        raise ValueError("inside")
    assert _state("tpt-probe") == "free"
    lock_path("tpt-probe").unlink()


def test_widening_the_allowed_congestion_controls_holds_the_lock():
    assert _state("congestion") == "free"
    with allowed_for_namespaces("cubic"):
        assert _state("congestion") == "held"
    assert _state("congestion") == "free"
