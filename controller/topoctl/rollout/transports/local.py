"""`local`: the agent on this machine, or inside one of its network namespaces (the lab).

The agent of this installation runs as children of a fork server (`topoagent.zygote`: the
interpreter's start-up and the agent's imports once per transport, not once per call: 0.3 of a
call's 0.4 CPU-s); a user-given `agent` command, a `prefix`, or TOPO_AGENT_ZYGOTE=0 runs each
call as a process of its own, as does every call when the server cannot start."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from topoagent.zygote import Child, Zygote, ZygoteError, stream_lines
from topoctl.rollout.transports import UNREACHABLE, AgentReply, agent_argv, signal_name

AGENT = [sys.executable, "-m", "topoagent.cli"]  # the agent of this installation
ZYGOTE_ENV = "TOPO_AGENT_ZYGOTE"  # "0": every agent call a process of its own (debugging)


class LocalTransport:
    """Every host maps to this machine (`netns=None`) or to a namespace on it."""

    name = "local"

    def __init__(self, netns: dict[str, str | None], state_dirs: dict[str, Path] | None = None,
                 agent: list[str] | None = None, ovsdb: dict[str, str] | None = None,
                 prefix: dict[str, list[str]] | None = None,
                 env: dict[str, dict[str, str]] | None = None, zygote: bool | None = None):
        self.netns = netns
        # host -> argv the agent is started under (a wrapper command: always a process)
        self.prefix = prefix or {}
        # host -> variables added to the agent's environment (a lab host's TOPO_RANK_CGROUP,
        # `Lab.rank_env`: the ranks it launches join the host's CPU group, the agent does not)
        self.env = env or {}
        self.state_dirs = state_dirs or {}
        self.cmd = agent or AGENT
        self.ovsdb = ovsdb or {}  # host -> its ovsdb-server (lab hosts running OVS)
        self._running: set[subprocess.Popen | Child] = set()  # streams under way (`close`)
        self._lock = threading.Lock()
        if zygote is None:
            zygote = os.environ.get(ZYGOTE_ENV, "1") != "0"
        # the fork server of this installation's agent (None: every call a process of its own),
        # started on the first call, ended by close
        self.zygote = Zygote() if zygote and self.cmd == AGENT else None

    def _agent_args(self, host: str) -> list[str]:
        """The agent's arguments before the verb's: output, state directory, namespace, OVS."""
        argv = agent_argv([], self.state_dirs.get(host))
        if self.netns.get(host):
            argv += ["--netns", self.netns[host]]
        if self.ovsdb.get(host):
            argv += ["--ovsdb", self.ovsdb[host]]
        return argv

    def _argv(self, host: str) -> list[str]:
        """The command line of a call run as a process of its own."""
        return self.prefix.get(host, []) + self.cmd + self._agent_args(host)

    def _environ(self, host: str) -> dict[str, str] | None:
        """The agent's whole environment (None: this process's own, unchanged)."""
        return {**os.environ, **self.env[host]} if self.env.get(host) else None

    def _forked(self, host: str) -> Zygote | None:
        """The fork server for this host's calls, None when they run as processes."""
        z = self.zygote
        return z if z is not None and not self.prefix.get(host) and z.available() else None

    def _spawn(self, z: Zygote, host: str, args: list[str], stdin: str | None,
               stdout: int, stderr: int) -> Child:
        """A forked agent with the call's argv, environment and working directory."""
        return z.spawn(self._agent_args(host) + args, self._environ(host) or dict(os.environ),
                       (stdin or "").encode(), stdout, stderr, _cwd())

    def stream(self, host: str, args: list[str], stdin: str | None,
               on_line: Callable[[str, str], None], timeout: float | None = None) -> int:
        """Run the agent with `args`, each output line to on_line(host, line) as it comes; its exit
        code."""
        z = self._forked(host)
        if z is not None:
            r, w = os.pipe()
            try:
                p = self._spawn(z, host, args, stdin, w, w)
            except ZygoteError:
                p = None
                os.close(r)
            finally:
                os.close(w)  # the child's copy is the only writer: EOF when it ends
            if p is not None:
                return self._follow(host, p, stream_lines(r), on_line, timeout)
        try:
            p = subprocess.Popen(self._argv(host) + args, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=self._environ(host))
        except OSError as e:
            on_line(host, f"cannot run the agent: {e}")
            return UNREACHABLE
        assert p.stdin is not None and p.stdout is not None
        pipe = p.stdin

        def feed() -> None:  # after `close` can see it: it ends one that does not read
            pipe.write(stdin or "")
            pipe.close()
        return self._follow(host, p, p.stdout, on_line, timeout, feed)

    def _follow(self, host: str, p: subprocess.Popen | Child, out,
                on_line: Callable[[str, str], None], timeout: float | None,
                feed: Callable[[], None] | None = None) -> int:
        """Each line of a running agent's output to on_line until it ends; its exit code."""
        with self._lock:
            self._running.add(p)
        try:
            if feed is not None:
                feed()
            with out:
                for line in out:
                    on_line(host, line.rstrip("\n"))
            return p.wait(timeout=timeout)
        except ZygoteError as e:
            on_line(host, str(e))
            return UNREACHABLE
        finally:
            with self._lock:
                self._running.discard(p)

    def agent(self, host: str, args: list[str], stdin: str | None = None,
              timeout: float = 120.0) -> AgentReply:
        """Run the agent with `args` and `stdin`; its reply (UNREACHABLE when it cannot be started
        or times out)."""
        try:
            r = self._run(host, args, stdin, timeout)
        except subprocess.TimeoutExpired:
            return AgentReply(host, UNREACHABLE, "", f"agent timed out after {timeout:.0f}s")
        except OSError as e:  # ZygoteError included
            return AgentReply(host, UNREACHABLE, "", f"cannot run the agent: {e}")
        return AgentReply(host, r.returncode, r.stdout, r.stderr,
                          killed=signal_name(r.returncode))

    def _run(self, host: str, args: list[str], stdin: str | None,
             timeout: float) -> subprocess.CompletedProcess:
        """One call to completion: forked when it can be, else a process of its own."""
        z = self._forked(host)
        if z is not None:
            try:
                return z.run(self._agent_args(host) + args, stdin, self._environ(host), timeout,
                             _cwd())
            except ZygoteError:
                if z.available():  # the server took the call and lost it: never run it twice
                    raise
        return subprocess.run(self._argv(host) + args, input=stdin, capture_output=True,
                              text=True, timeout=timeout, env=self._environ(host))

    def close(self, grace: float = 10.0) -> None:
        """End the agents still streaming (an interrupted `run`): SIGTERM, which makes a
        launcher stop its ranks, then SIGKILL after `grace` seconds."""
        with self._lock:
            running = list(self._running)
        for p in running:
            p.terminate()  # a no-op on one that has ended
        end = time.monotonic() + grace
        for p in running:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
            except ZygoteError:
                pass  # the fork server ended: nobody can report this one's exit
        if self.zygote is not None:  # later calls run as processes of their own
            self.zygote.close(grace)


def _cwd() -> str | None:
    """This process's working directory, the agent's as a process of its own (None: gone)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def lab_transport(lab) -> LocalTransport:
    """The lab's hosts through `--netns`, with one agent state directory per host under the
    lab's own state directory (shared with the lab's SSH transport)."""
    hosts = [h.name for h in lab.cluster.hosts]
    ovsdb = {h: db for h in hosts if (db := lab.ovsdb(h))}
    t = LocalTransport({h: lab.netns(h) for h in hosts}, agent_state_dirs(lab), ovsdb=ovsdb,
                       env={h: env for h in hosts if (env := lab.rank_env(h))})
    t.name = "lab"
    return t


def agent_state_dirs(lab) -> dict[str, Path]:
    """Each lab host's agent state directory, under the lab's state directory."""
    return {h.name: lab.state_dir / "agent" / h.name for h in lab.cluster.hosts}
