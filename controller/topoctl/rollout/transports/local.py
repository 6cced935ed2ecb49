"""`local`: the agent on this machine, or inside one of its network namespaces (the lab)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from topoctl.rollout.transports import UNREACHABLE, AgentReply, agent_argv, signal_name

AGENT = [sys.executable, "-m", "topoagent.cli"]  # the agent of this installation


class LocalTransport:
    """Every host maps to this machine (`netns=None`) or to a namespace on it."""

    name = "local"

    def __init__(self, netns: dict[str, str | None], state_dirs: dict[str, Path] | None = None,
                 agent: list[str] | None = None, ovsdb: dict[str, str] | None = None,
                 prefix: dict[str, list[str]] | None = None):
        self.netns = netns
        # host -> argv the agent is started under (a lab host's `env TOPO_RANK_CGROUP=...`,
        # `Lab.rank_env`: the ranks it launches join the host's CPU group, the agent does not)
        self.prefix = prefix or {}
        self.state_dirs = state_dirs or {}
        self.cmd = agent or AGENT
        self.ovsdb = ovsdb or {}  # host -> its ovsdb-server (lab hosts running OVS)
        self._running: set[subprocess.Popen] = set()  # streams under way (`close` ends them)
        self._lock = threading.Lock()

    def _argv(self, host: str) -> list[str]:
        argv = self.prefix.get(host, []) + agent_argv(self.cmd, self.state_dirs.get(host))
        if self.netns.get(host):
            argv += ["--netns", self.netns[host]]
        if self.ovsdb.get(host):
            argv += ["--ovsdb", self.ovsdb[host]]
        return argv

    def stream(self, host: str, args: list[str], stdin: str | None,
               on_line: Callable[[str, str], None], timeout: float | None = None) -> int:
        """Run the agent with `args`, each output line to on_line(host, line) as it comes; its exit
        code."""
        try:
            p = subprocess.Popen(self._argv(host) + args, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            on_line(host, f"cannot run the agent: {e}")
            return UNREACHABLE
        assert p.stdin is not None and p.stdout is not None
        with self._lock:
            self._running.add(p)
        try:
            p.stdin.write(stdin or "")
            p.stdin.close()
            for line in p.stdout:
                on_line(host, line.rstrip("\n"))
            return p.wait(timeout=timeout)
        finally:
            with self._lock:
                self._running.discard(p)

    def agent(self, host: str, args: list[str], stdin: str | None = None,
              timeout: float = 120.0) -> AgentReply:
        """Run the agent with `args` and `stdin`; its reply (UNREACHABLE when it cannot be started
        or times out)."""
        argv = self._argv(host)
        try:
            r = subprocess.run(argv + args, input=stdin, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            return AgentReply(host, UNREACHABLE, "", f"agent timed out after {timeout:.0f}s")
        except OSError as e:
            return AgentReply(host, UNREACHABLE, "", f"cannot run the agent: {e}")
        return AgentReply(host, r.returncode, r.stdout, r.stderr,
                          killed=signal_name(r.returncode))

    def close(self, grace: float = 10.0) -> None:
        """End the agents still streaming (an interrupted `run`): SIGTERM, which makes a
        launcher stop its ranks, then SIGKILL after `grace` seconds."""
        with self._lock:
            running = list(self._running)
        for p in running:
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + grace
        for p in running:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()


def lab_transport(lab) -> LocalTransport:
    """The lab's hosts through `--netns`, with one agent state directory per host under the
    lab's own state directory (shared with the lab's SSH transport)."""
    hosts = [h.name for h in lab.cluster.hosts]
    ovsdb = {h: db for h in hosts if (db := lab.ovsdb(h))}
    t = LocalTransport({h: lab.netns(h) for h in hosts}, agent_state_dirs(lab), ovsdb=ovsdb,
                       prefix={h: ["env", *(f"{k}={v}" for k, v in env.items())]
                               for h in hosts if (env := lab.rank_env(h))})
    t.name = "lab"
    return t


def agent_state_dirs(lab) -> dict[str, Path]:
    """Each lab host's agent state directory, under the lab's state directory."""
    return {h.name: lab.state_dir / "agent" / h.name for h in lab.cluster.hosts}
