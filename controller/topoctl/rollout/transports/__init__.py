"""Transports: how the controller reaches the topo-agent on each host.

Every transport runs the same fixed agent command line (`topo-agent --json --detailed-exitcode
<verb> -`: the agent's exit code 2 says it changed something or found changes pending, 0 that
there was nothing to do) and streams the host's state on stdin: plan values never become part
of a command or a shell string. One interface, three implementations:
- `lab`: the local namespace testbed (`topo-agent --netns <ns>`), the default when a lab named
  after the plan's cluster is up;
- `ssh`: paramiko with key auth and strict host-key checking against known_hosts;
- `local`: this machine itself.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass
class AgentReply:
    """What one agent call returned: exit code (255 unreachable), stdout and stderr."""

    host: str
    rc: int  # the agent's exit code; 255 = unreachable (no agent answer at all)
    out: str
    err: str
    # the agent died without an exit code of its own: "signal 9, SIGKILL" (a local process,
    # or over SSH through the transport's wrapper)
    killed: str | None = None
    # over SSH: the call ended with no exit status at all, the session dropped under it (the
    # agent may still be running, or have finished, on the host)
    dropped: str | None = None

    def json(self) -> dict:
        """The agent's --json document (or an error document built from what came back)."""
        try:
            doc = json.loads(self.out)
            if isinstance(doc, dict):
                return doc
        except ValueError:
            pass
        return {"ok": False, "error": (self.err or self.out).strip() or f"exit {self.rc}",
                "problems": []}


UNREACHABLE = 255


def signal_name(rc: int) -> str | None:
    """`signal 9, SIGKILL` for a process killed by a signal (a negative return code)."""
    if rc >= 0:
        return None
    try:
        return f"signal {-rc}, {signal.Signals(-rc).name}"
    except ValueError:
        return f"signal {-rc}"


def agent_argv(cmd: list[str], state_dir: Path | None) -> list[str]:
    """The fixed start of every agent command line: JSON output, --detailed-exitcode (the
    rollout reads "changed" from exit code 2; without it a successful agent exits 0 whether
    or not it changed anything), the host's state directory."""
    return [*cmd, "--json", "--detailed-exitcode",
            *(["--state-dir", str(state_dir)] if state_dir else [])]


class Transport(Protocol):
    """How the controller reaches a host's agent: the interface every transport implements."""

    name: str

    def agent(self, host: str, args: list[str], stdin: str | None = None,
              timeout: float = 120.0) -> AgentReply:
        """Run `topo-agent --json --detailed-exitcode <args>` on `host`, feeding `stdin`."""
        ...

    def stream(self, host: str, args: list[str], stdin: str | None,
               on_line: Callable[[str, str], None], timeout: float | None = None) -> int:
        """Like `agent`, for long runs: each output line goes to on_line(host, line) as it
        comes; returns the exit code (UNREACHABLE when the host cannot be reached)."""
        ...

    def close(self) -> None:
        """Release connections (no agent call may follow)."""
