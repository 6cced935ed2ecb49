"""`topo-agent` processes without the interpreter's start-up: for tests that run hundreds.

A server process imports the agent once (its CLI, pydantic models, pyroute2: 0.3 s on a quiet
machine, 2 s on a loaded one, most of a short agent call) and then forks one child per call.
Each child is a real process of its own, running `topoagent.cli.main(argv)`, the function
`python -m topoagent.cli` runs, with the call's environment, stdin, stdout and stderr; it can be
killed for real (the crash switch's SIGKILL gives returncode -9, as from `subprocess.run`). The
server is single-threaded and has done nothing but import when it forks, so every child starts
from the same clean state a new interpreter would have."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path

_SERVER = r'''
import json, os, sys
import topoagent.cli as cli
import topoagent.drivers.netlink  # noqa: F401 - what apply and recovery import late

def child(req):
    for fd, (path, flags) in enumerate([(req["stdin"], os.O_RDONLY),
                                        (req["stdout"], os.O_WRONLY | os.O_TRUNC),
                                        (req["stderr"], os.O_WRONLY | os.O_TRUNC)]):
        os.dup2(os.open(path, flags), fd)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    if req.get("environ") is not None:  # the caller's whole environment, as a new process gets
        os.environ.clear()
        os.environ.update(req["environ"])
    os.environ.update(req["env"])
    try:
        code = cli.main(req["argv"])
    except SystemExit as e:  # argparse's --help, usage errors
        code = e.code if isinstance(e.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

reply = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # a stray print of the server goes nowhere
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    _, status = os.waitpid(pid, 0)
    reply.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    reply.flush()
'''


class ForkAgent:
    """The server; `run` is `subprocess.run([python, -m, topoagent.cli, *argv], ...)`."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, argv: list[str], stdin: str | None = None, env: dict | None = None,
            timeout: float = 120.0, environ: dict | None = None) -> subprocess.CompletedProcess:
        """The call's result; `env` is added to the server's environment, `environ` replaces it
        (pass `dict(os.environ)` for what `subprocess.run` would give the child)."""
        files = {k: self.tmp / f"fork.{k}" for k in ("stdin", "stdout", "stderr")}
        files["stdin"].write_text(stdin or "")
        for k in ("stdout", "stderr"):
            files[k].write_text("")
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "env": env or {}, "environ": environ,
                                          **{k: str(p) for k, p in files.items()}}) + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(argv, timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the agent fork server died")
        return subprocess.CompletedProcess(["topo-agent", *argv], json.loads(line),
                                           files["stdout"].read_text(),
                                           files["stderr"].read_text())

    def close(self) -> None:
        """End the server (its children have all been waited for)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
