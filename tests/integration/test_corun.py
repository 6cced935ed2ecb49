"""`graph.corun.co_running`: copies of a training step run (processes forked by a fork server
that imported torch once, busy on the CPU)
for as long as the context lasts, and are gone after it, also when the body raises."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

from topoctl.graph.corun import co_running


def _procs() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, command line), as /proc says."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline").read()
        except OSError:
            continue
        out[int(pid)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd)
    return out


def _children() -> list[int]:
    """The copies: children of this process's multiprocessing fork server."""
    procs = _procs()
    servers = {pid for pid, (ppid, cmd) in procs.items()
               if ppid == os.getpid() and "forkserver" in cmd}
    return [pid for pid, (ppid, _) in procs.items() if ppid in servers]


def _cpu_ticks(pid: int) -> int:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


@pytest.mark.serial  # CPU time in 0.5 s
def test_copies_train_during_the_context_and_are_reaped():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    x = (torch.randn(32, 64),)
    with co_running(model, x, 2):
        kids = _children()
        assert len(kids) == 2
        before = {p: _cpu_ticks(p) for p in kids}
        time.sleep(0.5)
        assert all(_cpu_ticks(p) > before[p] for p in kids)  # stepping, not waiting
    assert _children() == []
    with pytest.raises(ValueError, match="inside"), co_running(model, x, 1):
        assert len(_children()) == 1
        raise ValueError("inside")
    assert _children() == []
    with co_running(model, x, 0):  # none asked: none started
        assert _children() == []


def test_a_copy_that_cannot_run_the_step_is_an_error_and_leaves_nothing():
    model = nn.Linear(64, 8)
    with pytest.raises(RuntimeError, match="did not start"), \
            co_running(model, (torch.randn(4, 7),), 2):  # 7 features into a 64-input layer
        pass
    assert _children() == []
