"""`make demo`: the main job. Until the planner and `topoctl apply` land, a two-host agent demo.

Two network namespaces joined by a veth cable; topo-agent gives host A an address, a training
address on lo, a route to B's training address and a per-destination HTB class, verifies it,
re-applies (nothing to do), pings across, shows what iproute2 sees, rolls back, and removes
everything it made, also when interrupted."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

PREFIX = f"tpd-{os.getpid()}"
A, B = f"{PREFIX}-a", f"{PREFIX}-b"
STATE_A = """\
interfaces:
  - {name: tpdemo0, addresses: [10.231.200.1/24], up: true}
  - {name: lo, addresses: [10.236.200.1/32], up: true}
sysctl: {ip_forward: true}
routes:
  - {dst: 10.236.200.2/32, via: 10.231.200.2, src: 10.236.200.1}
qos:
  - dev: tpdemo0
    rate: 100mbit
    classes:
      - {dst: 10.236.200.2, rate: 40mbit, ceil: 60mbit}
"""
STATE_B = """\
interfaces:
  - {name: tpdemo1, addresses: [10.231.200.2/24], up: true}
  - {name: lo, addresses: [10.236.200.2/32], up: true}
routes:
  - {dst: 10.236.200.1/32, via: 10.231.200.1, src: 10.236.200.2}
"""


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, text=True, capture_output=True)
    out = (r.stdout + r.stderr).rstrip()
    if out:
        print("  " + out.replace("\n", "\n  "), flush=True)
    if check and r.returncode not in (0, 2):
        raise SystemExit(f"demo failed: {' '.join(cmd)} exited {r.returncode}")
    return r


def main() -> int:
    if os.geteuid() != 0:
        print("the demo needs root (network namespaces)", file=sys.stderr)
        return 1
    agent = [sys.executable, "-m", "topoagent.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        sa, sb = Path(tmp, "a.yaml"), Path(tmp, "b.yaml")
        sa.write_text(STATE_A)
        sb.write_text(STATE_B)
        try:
            run("ip", "netns", "add", A)
            run("ip", "netns", "add", B)
            run("ip", "-n", A, "link", "add", "tpdemo0", "type", "veth", "peer", "name",
                "tpdemo1", "netns", B)
            for ns, path in ((A, sa), (B, sb)):
                base = [*agent, "--netns", ns, "--state-dir", str(Path(tmp, ns))]
                run(*base, "diff", str(path))
                run(*base, "apply", str(path))
                run(*base, "apply", str(path))  # idempotent: nothing to do
            run("ip", "netns", "exec", A, "ping", "-c", "2", "-W", "1", "-I", "10.236.200.1",
                "10.236.200.2")
            run("ip", "-n", A, "route", "show", "10.236.200.2")
            run("tc", "-n", A, "class", "show", "dev", "tpdemo0")
            run("tc", "-n", A, "filter", "show", "dev", "tpdemo0")
            run(*agent, "--netns", A, "--state-dir", str(Path(tmp, A)), "rollback")
            run("ip", "-n", A, "-br", "addr")
        finally:
            for ns in (A, B):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    print("demo finished; namespaces removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
