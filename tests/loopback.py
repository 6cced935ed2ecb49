"""Loopback helpers for tests that start torch.distributed processes on this machine."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

# What every spawned rank imports before it runs a line of its test: loaded once, by the fork
# server, instead of once per rank (torch alone is ~2.2 CPU-s of each rank's ~5 on this VM;
# torch._dynamo, which DDP's constructor and the first backward import, ~1.3 more)
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "pytest",
           "topotrain.train"]


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


def run_module_ranks(module: str, envs: list[dict[str, str]], outs: list[Path],
                     timeout: float) -> list[int | None]:
    """`python -m module` once per environment in `envs`, side by side: process i runs with
    exactly the environment ``envs[i]`` and its stdout and stderr both go to the file
    ``outs[i]``; their exit codes (None: killed after `timeout` seconds, as every process
    still running then is). The processes are forked from the fork server with
    :data:`PRELOAD` imported, and run the module's own ``__main__`` code (`runpy`), so a rank
    starts without importing torch again (~3.5 CPU-s a rank on this VM); the agent's launches
    in the lab tests exec the real command."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    procs = [ctx.Process(target=_run_module, args=(module, env, str(out)))
             for env, out in zip(envs, outs, strict=True)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
            if p.exitcode is None:  # the deadline passed: no rank is waited for any longer
                timeout = 0
        return [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.pid is not None and p.exitcode is None:  # started, still running
                p.kill()
                p.join()


def _run_module(module: str, env: dict[str, str], out: str) -> None:
    """The child of `run_module_ranks`: its output into `out`, `env` as its whole environment,
    then `module` run as ``__main__``; the process ends as `python -m module` would (exit code
    of its SystemExit, 1 and the traceback on an exception) but through `os._exit`, so
    nothing the fork server or multiprocessing registered (finalizers, the join of non-daemon
    threads) runs in it. `topotrain.train` leaves by `os._exit` itself (`topotrain.lifetime`)."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [module]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001 (reported as the interpreter would, exit 1)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_code(arg: object) -> int:
    """The exit code of ``SystemExit(arg)``, as the interpreter maps it (a message: printed
    to stderr, code 1)."""
    if arg is None:
        return 0
    if isinstance(arg, int):
        return arg & 0xFF
    print(arg, file=sys.stderr)
    return 1
