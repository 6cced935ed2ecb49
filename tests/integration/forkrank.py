"""Training ranks without the interpreter's start-up: for the tests that run ranks on loopback.

A rank's start-up is mostly imports: torch, then torch._dynamo (DistributedDataParallel's
constructor imports it) and the runtime, about 4 CPU-s on the 2-core AMD VM, more than the few
iterations a test trains. A server process imports them once, exactly as `python -m
topotrain.train` does before `main` (the collector off during the imports, what they loaded
frozen), and then forks one child per rank. Each child is a real process of its own running
`topotrain.train.main`, the function `python -m topotrain.train` runs, with the rank's whole
environment, its stdout and stderr in one file, gloo between the processes as before; it can
be killed for real. The server is single-threaded and has done nothing but import when it
forks (no thread runs in it: importing torch starts none), so every child starts from the state
a new interpreter would reach.

Not for jobs that compile (`fusion`): inductor reads its configuration (the cache directory)
from the environment when torch._dynamo imports it, which the server did before the rank's
environment existed; those ranks start as new interpreters.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

_SERVER = r'''
import gc
gc.disable()
import json, os, sys, traceback
import torch, torch._dynamo  # noqa: F401 - what every rank loads before training
import topotrain.train as train
gc.freeze()
gc.enable()

def child(req):
    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    os.environ.clear()
    os.environ.update(req["environ"])
    try:
        code = train.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

reply = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # a stray print of the server goes nowhere
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "spawn":
        pid = os.fork()
        if pid == 0:
            child(req)
        reply.write(json.dumps(pid) + "\n")
    else:  # "wait"
        _, status = os.waitpid(req["pid"], 0)
        reply.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    reply.flush()
'''


class RankFork:
    """The server: `spawn` starts a rank (its pid), `wait` its exit code (as Popen's)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def _ask(self, req: dict, timeout: float | None = None):
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        if timeout is not None and not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(["rank", str(req.get("pid"))], timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the rank fork server died")
        return json.loads(line)

    def spawn(self, environ: dict, out: Path) -> int:
        """A rank with exactly `environ`, stdout and stderr to `out`: its pid."""
        return self._ask({"op": "spawn", "environ": environ, "out": str(out)})

    def wait(self, pid: int, timeout: float | None = None) -> int:
        """The rank's exit code (negative: the signal that ended it); TimeoutExpired after
        `timeout` s (the server then still waits for it: kill the rank, then `wait` again)."""
        return self._ask({"op": "wait", "pid": pid}, timeout)

    def pending(self) -> int:
        """The reply of a `wait` that timed out, once its rank has ended."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the rank fork server died")
        return json.loads(line)

    @staticmethod
    def kill(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_server: RankFork | None = None


def server() -> RankFork:
    """This process's server, started on first use and ended when the process exits (one per
    xdist worker: it holds torch, about the memory of one rank)."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = RankFork()
        atexit.register(_server.close)
    return _server
