"""`python -m topotrain.train` with its gloo worker threads starved: run as a module by
`tests.loopback.run_module_ranks` (test_train_ddp). Every thread of the rank is pinned to
one CPU ($STARVE_CPU) and, once the process group exists, the main thread runs SCHED_FIFO:
a gloo worker then runs only while the main thread waits. After the last AllReduce the main
thread goes on to its end before the worker drops that work, which is the interleaving that
left ranks hanging after `done` on a loaded machine (`topotrain.lifetime`), made certain."""

from __future__ import annotations

import os
import runpy
import sys

import torch.distributed as dist

_init = dist.init_process_group


def _init_then_outrank_gloo(*args, **kwargs):
    """`init_process_group`, then the calling (main) thread above gloo's threads, which it
    has just created and which keep the normal policy."""
    _init(*args, **kwargs)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))


if __name__ == "__main__":
    os.sched_setaffinity(0, {int(os.environ["STARVE_CPU"])})  # later threads inherit it
    dist.init_process_group = _init_then_outrank_gloo
    sys.argv = ["topotrain.train"]
    runpy.run_module("topotrain.train", run_name="__main__", alter_sys=True)
