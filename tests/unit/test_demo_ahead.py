"""`bench.demo.ahead`: which of the demo's strategies are planned in the idle-priority child,
and the child's whole process tree back at the normal priority once the demo waits for it
(real processes, their scheduling policy read back from the kernel)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.demo.ahead import normal_priority, planned_ahead

# a process at idle priority that starts a child (which inherits it), then sleeps
TREE = """
import os, subprocess, sys, time
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(kid.pid, flush=True)
time.sleep(60)
"""


def test_the_pipeline_strategies_are_planned_ahead_and_the_data_parallel_ones_not():
    assert [s for s in ("baseline", "baseline+bandwidth", "pipeline", "placement", "tag",
                        "topoopt", "trees", "trees+bandwidth", "baseline+sfb")
            if planned_ahead(s)] == ["pipeline", "placement", "tag"]


def test_normal_priority_reaches_every_process_the_child_started():
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    kid = None
    try:
        kid = int(parent.stdout.readline())
        time.sleep(0.2)
        assert os.sched_getscheduler(parent.pid) == os.SCHED_IDLE
        assert os.sched_getscheduler(kid) == os.SCHED_IDLE  # inherited
        normal_priority(parent.pid)
        assert os.sched_getscheduler(parent.pid) == os.SCHED_OTHER
        assert os.sched_getscheduler(kid) == os.SCHED_OTHER
    finally:
        parent.kill()
        parent.wait()
        if kid is not None:
            os.kill(kid, 9)
