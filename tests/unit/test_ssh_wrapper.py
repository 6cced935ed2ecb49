"""The SSH transport's /bin/sh wrapper, run for real: it passes the agent's exit code and stdin
through and names the signal that killed it (which paramiko would drop)."""

from __future__ import annotations

import subprocess
import sys

from topoctl.rollout.transports.ssh import WRAPPER, killed_by


def wrapped(code: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", WRAPPER, "topo-agent", sys.executable, "-c", code],
                          input=stdin, capture_output=True, text=True, timeout=30)


def test_exit_codes_and_stdin_pass_through():
    r = wrapped("import sys; print(sys.stdin.read().upper()); sys.exit(2)", "state")
    assert (r.returncode, r.stdout, r.stderr) == (2, "STATE\n", "")
    assert killed_by(r.returncode, r.stderr) is None


def test_a_killed_agent_is_named_with_its_signal():
    r = wrapped("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.returncode == 137
    assert r.stderr.strip().splitlines()[-1] == "topo-agent: killed by signal 9"
    assert killed_by(r.returncode, r.stderr) == 9
    r = wrapped("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert killed_by(r.returncode, r.stderr) == 15


def test_only_the_wrappers_own_line_counts():
    assert killed_by(137, "topo-agent: killed by signal 8\n") is None  # code and line differ
    assert killed_by(1, "topo-agent: killed by signal 9\n") is None
    assert killed_by(137, "some other last line\n") is None
