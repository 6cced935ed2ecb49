"""`ssh`: paramiko, key auth, strict host-key checking, one connection per host, reused.

The remote command is a fixed argv (the agent path, `--state-dir` and `--ovsdb` from the
transport's own configuration, the verb) joined with shlex quoting; the host state goes over
stdin. Unknown or changed host keys are refused (RejectPolicy) unless the operator passes
`insecure=True`.

Two things plain paramiko loses, and how this transport keeps them:
- The agent killed by a signal: sshd reports it as an `exit-signal` request, which paramiko
  ignores (the call ends with no exit status, as when the session drops). The agent therefore
  runs under a fixed `/bin/sh` wrapper (`WRAPPER`, no plan value in it) that exits with the
  shell's 128 + N and prints `topo-agent: killed by signal N` on stderr: the reply says
  `killed` with the signal, and a call with no exit status at all is a dropped session.
- A host that stops answering mid-call (cut off by its own apply): `Keepalive` asks sshd for an
  answer every `keepalive` seconds and gives up after `keepalive_count` unanswered, so the call
  ends UNREACHABLE within seconds instead of at the command timeout."""

from __future__ import annotations

import re
import shlex
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import paramiko

from topoctl.rollout.transports import UNREACHABLE, AgentReply, agent_argv, signal_name
from topoctl.rollout.transports.keepalive import Keepalive
from topoctl.rollout.transports.local import AGENT, agent_state_dirs

# Runs the agent ("$@") and says which signal killed it; fixed text, the argv follows as
# positional parameters, so nothing of a plan is ever parsed by a shell.
WRAPPER = ('"$@"; s=$?; if [ "$s" -gt 128 ]; then '
           'echo "topo-agent: killed by signal $((s - 128))" >&2; fi; exit "$s"')
_KILLED = re.compile(r"^topo-agent: killed by signal (\d+)$")
DROPPED = ("SSH session dropped before the agent's exit status (its sshd or the connection "
           "went away)")


def killed_by(rc: int, err: str) -> int | None:
    """The signal that killed the agent, from the wrapper's exit code and last stderr line."""
    lines = err.strip().splitlines()
    m = _KILLED.match(lines[-1]) if lines and rc > 128 else None
    return int(m.group(1)) if m and rc == 128 + int(m.group(1)) else None


class SshTransport:
    """The `ssh` transport: one paramiko connection per host, key auth, strict host-key checking."""

    name = "ssh"

    def __init__(self, addresses: dict[str, str], key: Path, known_hosts: Path | None,
                 user: str = "root", port: int = 22, agent: list[str] | None = None,
                 state_dirs: dict[str, Path] | None = None, connect_timeout: float = 10.0,
                 ovsdb: dict[str, str] | None = None, keepalive: float = 2.0,
                 keepalive_count: int = 3):
        self.addresses = addresses
        self.key = key
        self.known_hosts = known_hosts
        self.user = user
        self.port = port
        self.cmd = agent or ["topo-agent"]
        self.state_dirs = state_dirs or {}
        self.connect_timeout = connect_timeout
        self.ovsdb = ovsdb or {}  # host -> its ovsdb-server (the agent's --ovsdb)
        # ServerAliveInterval / CountMax: an unreachable host is reported after ~6-8 s
        self.keepalive = keepalive
        self.keepalive_count = keepalive_count
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._lock = threading.Lock()

    def _client(self, host: str) -> paramiko.SSHClient:
        with self._lock:
            c = self._clients.get(host)
        if c is not None and c.get_transport() is not None and c.get_transport().is_active():
            return c
        c = paramiko.SSHClient()
        try:
            if self.known_hosts is not None:
                c.load_host_keys(str(self.known_hosts))
            else:
                c.load_system_host_keys()
        except (OSError, ValueError) as e:  # missing or corrupt (UnicodeDecodeError is one)
            raise paramiko.SSHException(f"cannot read known_hosts {self.known_hosts}: {e}"
                                        ) from None
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(self.addresses[host], port=self.port, username=self.user,
                  key_filename=str(self.key), timeout=self.connect_timeout,
                  banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                  allow_agent=False, look_for_keys=False)
        with self._lock:
            self._clients[host] = c
        return c

    def argv(self, host: str, args: list[str]) -> list[str]:
        """The agent's command line on `host` (before the wrapper): the agent command, its
        fixed options, this host's --state-dir and --ovsdb, then `args`."""
        db = ["--ovsdb", self.ovsdb[host]] if self.ovsdb.get(host) else []
        return agent_argv(self.cmd, self.state_dirs.get(host)) + db + args

    def _command(self, host: str, args: list[str], wrap: bool = True) -> str:
        argv = self.argv(host, args)
        return shlex.join(["/bin/sh", "-c", WRAPPER, "topo-agent", *argv] if wrap else argv)

    def stream(self, host: str, args: list[str], stdin: str | None,
               on_line: Callable[[str, str], None], timeout: float | None = None) -> int:
        """Run the agent on `host` over SSH, each output line to on_line(host, line); its exit
        code (UNREACHABLE, with a line saying why, when the host stops answering keepalives)."""
        watch = None
        try:
            client = self._client(host)
            with Keepalive(client.get_transport(), self.keepalive,
                           self.keepalive_count) as watch:
                # unwrapped: `run` supervises ranks that stream for minutes, signals included
                chan_in, chan_out, _ = client.exec_command(
                    self._command(host, args, wrap=False), timeout=timeout)
                chan_out.channel.set_combine_stderr(True)
                chan_in.write(stdin or "")
                chan_in.channel.shutdown_write()
                for line in chan_out:
                    on_line(host, line.rstrip("\n"))
                rc = chan_out.channel.recv_exit_status()
        except (KeyError, paramiko.SSHException, OSError, EOFError) as e:
            why = watch.lost if watch is not None and watch.lost else e
            on_line(host, f"ssh {self.addresses.get(host)}: {why}")
            return UNREACHABLE
        if watch.lost:  # keepalives unanswered: the connection was closed under the stream
            on_line(host, f"ssh {self.addresses.get(host)}: {watch.lost}")
            return UNREACHABLE
        return rc

    def agent(self, host: str, args: list[str], stdin: str | None = None,
              timeout: float = 120.0) -> AgentReply:
        """Run the agent on `host` over SSH with `stdin`; its reply (UNREACHABLE when SSH fails)."""
        command = self._command(host, args)
        watch = None
        try:
            client = self._client(host)
            with Keepalive(client.get_transport(), self.keepalive,
                           self.keepalive_count) as watch:
                chan_in, chan_out, chan_err = client.exec_command(command, timeout=timeout)
                if stdin is not None:
                    chan_in.write(stdin)
                chan_in.channel.shutdown_write()
                out = chan_out.read().decode(errors="replace")
                err = chan_err.read().decode(errors="replace")
                rc = chan_out.channel.recv_exit_status()
        except KeyError:
            return AgentReply(host, UNREACHABLE, "", f"no address for host {host}")
        except paramiko.BadHostKeyException as e:
            return AgentReply(host, UNREACHABLE, "", f"host key mismatch for {e.hostname}: "
                              "refusing to connect (update known_hosts if this is expected)")
        except (paramiko.SSHException, OSError, EOFError) as e:  # timeouts, refusals, closes
            why = watch.lost if watch is not None and watch.lost else e
            return AgentReply(host, UNREACHABLE, "", f"ssh {self.addresses.get(host)}: {why}")
        if watch.lost:  # keepalives unanswered: the connection was closed under the call
            return AgentReply(host, UNREACHABLE, out, f"ssh {self.addresses.get(host)}: "
                              f"{watch.lost}")
        if rc == -1:  # no exit status: the wrapper reports signals, so the session dropped
            return AgentReply(host, rc, out, err, dropped=DROPPED)
        sig = killed_by(rc, err)
        if sig is not None:  # the reply names the signal instead of the wrapper's line and
            # the shell's own notice ("Killed")
            notice = signal.strsignal(sig) or "\0"
            lines = err.strip().splitlines()[:-1]
            while lines and notice in lines[-1]:
                lines.pop()
            return AgentReply(host, -sig, out, "\n".join(lines), killed=signal_name(-sig))
        return AgentReply(host, rc, out, err)

    def close(self) -> None:
        """Close every host's SSH connection."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()


def lab_ssh_transport(lab) -> SshTransport:
    """Reach the lab's hosts over their real sshd, as on bare metal."""
    hosts = [h.name for h in lab.cluster.hosts]
    return SshTransport({h: lab.layout.ssh_ip(h) for h in hosts},  # IPv6 in an IPv6-only lab
                        key=lab.ssh_key, known_hosts=lab.known_hosts, agent=AGENT,
                        state_dirs=agent_state_dirs(lab),
                        ovsdb={h: db for h in hosts if (db := lab.ovsdb(h))})
