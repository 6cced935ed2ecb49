"""Loopback helpers for tests that start torch.distributed processes on this machine."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable

# What every spawned rank imports before it runs a line of its test: loaded once, by the fork
# server, instead of once per rank (torch alone is ~2.2 CPU-s of each rank's ~5 on this VM)
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "pytest"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the rendezvous of a spawned process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """`fn(rank, *args)` in `nprocs` fresh processes, joined; raises if one fails (as
    torch.multiprocessing.spawn does). The processes are forked from multiprocessing's fork
    server with :data:`PRELOAD` imported: a clean single-threaded parent (no OpenMP pool, no
    xdist threads, unlike forking the test process), and torch imported once per test process
    rather than once per rank."""
    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
