"""`ssh`: paramiko, key auth, strict host-key checking, one connection per host, reused.

The remote command is a fixed argv (the agent path, `--state-dir` and `--ovsdb` from the
transport's own configuration, the verb) joined with shlex quoting; the host state goes over
stdin. Unknown or changed host keys are refused (RejectPolicy) unless the operator passes
`insecure=True`."""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable
from pathlib import Path

import paramiko

from topoctl.rollout.transports import UNREACHABLE, AgentReply, agent_argv


class SshTransport:
    """The `ssh` transport: one paramiko connection per host, key auth, strict host-key checking."""

    name = "ssh"

    def __init__(self, addresses: dict[str, str], key: Path, known_hosts: Path | None,
                 user: str = "root", port: int = 22, agent: list[str] | None = None,
                 state_dirs: dict[str, Path] | None = None, connect_timeout: float = 10.0,
                 ovsdb: dict[str, str] | None = None):
        self.addresses = addresses
        self.key = key
        self.known_hosts = known_hosts
        self.user = user
        self.port = port
        self.cmd = agent or ["topo-agent"]
        self.state_dirs = state_dirs or {}
        self.connect_timeout = connect_timeout
        self.ovsdb = ovsdb or {}  # host -> its ovsdb-server (the agent's --ovsdb)
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

    def _command(self, host: str, args: list[str]) -> str:
        db = ["--ovsdb", self.ovsdb[host]] if self.ovsdb.get(host) else []
        return shlex.join(agent_argv(self.cmd, self.state_dirs.get(host)) + db + args)

    def stream(self, host: str, args: list[str], stdin: str | None,
               on_line: Callable[[str, str], None], timeout: float | None = None) -> int:
        """Run the agent on `host` over SSH, each output line to on_line(host, line); its exit
        code."""
        try:
            client = self._client(host)
            chan_in, chan_out, _ = client.exec_command(self._command(host, args),
                                                       timeout=timeout)
            chan_out.channel.set_combine_stderr(True)
            chan_in.write(stdin or "")
            chan_in.channel.shutdown_write()
            for line in chan_out:
                on_line(host, line.rstrip("\n"))
            return chan_out.channel.recv_exit_status()
        except (KeyError, paramiko.SSHException, OSError) as e:
            on_line(host, f"ssh {self.addresses.get(host)}: {e}")
            return UNREACHABLE

    def agent(self, host: str, args: list[str], stdin: str | None = None,
              timeout: float = 120.0) -> AgentReply:
        """Run the agent on `host` over SSH with `stdin`; its reply (UNREACHABLE when SSH fails)."""
        command = self._command(host, args)
        try:
            client = self._client(host)
            chan_in, chan_out, chan_err = client.exec_command(command, timeout=timeout)
            if stdin is not None:
                chan_in.write(stdin)
            chan_in.channel.shutdown_write()
            out = chan_out.read().decode()
            err = chan_err.read().decode()
            rc = chan_out.channel.recv_exit_status()
        except KeyError:
            return AgentReply(host, UNREACHABLE, "", f"no address for host {host}")
        except paramiko.BadHostKeyException as e:
            return AgentReply(host, UNREACHABLE, "", f"host key mismatch for {e.hostname}: "
                              "refusing to connect (update known_hosts if this is expected)")
        except (paramiko.SSHException, OSError) as e:  # OSError covers timeouts and refusals
            return AgentReply(host, UNREACHABLE, "", f"ssh {self.addresses.get(host)}: {e}")
        if rc == -1:  # the channel closed without an exit status: sshd saw the agent killed
            # by a signal (paramiko ignores the exit-signal message) or the session dropped
            return AgentReply(host, rc, out, err, killed="no exit status: killed by a signal "
                              "or the SSH session dropped")
        return AgentReply(host, rc, out, err)

    def close(self) -> None:
        """Close every host's SSH connection."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()


def lab_ssh_transport(lab) -> SshTransport:
    """Reach the lab's hosts over their real sshd, as on bare metal."""
    from topoctl.rollout.transports.local import AGENT, agent_state_dirs

    hosts = [h.name for h in lab.cluster.hosts]
    return SshTransport({h: lab.mgmt_ip(h) for h in hosts},
                        key=lab.ssh_key, known_hosts=lab.known_hosts, agent=AGENT,
                        state_dirs=agent_state_dirs(lab),
                        ovsdb={h: db for h in hosts if (db := lab.ovsdb(h))})
