"""`topo-agent` processes without the interpreter's start-up: for tests that run hundreds.

The product's fork server (`topoagent.zygote`, the one the lab transport uses) imports the
agent once (its CLI, pydantic models, pyroute2: 0.3 s on a quiet machine, 2 s on a loaded one,
most of a short agent call) and then forks one child per call. Each child is a real process of
its own, running `topoagent.cli.main(argv)`, the function `python -m topoagent.cli` runs, with
the call's environment, stdin, stdout and stderr; it can be killed for real (the crash switch's
SIGKILL gives returncode -9, as from `subprocess.run`), and a call past its timeout is killed
as `subprocess.run` kills it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from topoagent.zygote import Zygote


class ForkAgent:
    """The server; `run` is `subprocess.run([python, -m, topoagent.cli, *argv], ...)`."""

    def __init__(self, tmp: Path):
        self.tmp = tmp  # kept for the callers' signature: the calls need no files
        self.environ = dict(os.environ)  # what the children start from unless told otherwise
        self.zygote = Zygote()

    def run(self, argv: list[str], stdin: str | None = None, env: dict | None = None,
            timeout: float = 120.0, environ: dict | None = None) -> subprocess.CompletedProcess:
        """The call's result; `env` is added to the environment this process had when the
        server was made, `environ` replaces that (pass `dict(os.environ)` for what
        `subprocess.run` would give the child)."""
        base = self.environ if environ is None else environ
        return self.zygote.run(argv, stdin, {**base, **(env or {})}, timeout)

    def close(self) -> None:
        """End the server (its children have all been waited for)."""
        self.zygote.close()
