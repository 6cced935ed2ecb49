"""Rank processes for the tests that run torch.distributed workers in the test's own code
(`torch.multiprocessing`): forked from the planner's timing fork server
(`topoctl.graph.forks`: torch imported there once, never used for compute, so a fork is safe),
where a rank started as a fresh interpreter paid ~2.5 s of CPU for its imports (8 ranks: a
test 41 s -> 12 s on the 2-core VM)."""

from __future__ import annotations

from collections.abc import Callable

import torch.multiprocessing as mp

from topoctl.graph.forks import FORKS


def start_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """Run ``fn(rank, *args)`` in `nprocs` processes and wait for all (raising if one fails),
    as `torch.multiprocessing.spawn` does. `fn` must be importable (a module-level function)."""
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method=FORKS.get_start_method())
