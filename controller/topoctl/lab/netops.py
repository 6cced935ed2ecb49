"""Running iproute2 batches and reading kernel state back (the lab's only contact with netlink).

Batches are fed on stdin (`ip -batch -`); `-force` keeps going after an error so a partly failed
teardown still removes everything else, while build batches stop at the first error and report
the failing line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from topoagent.protocol import TopoError

NETNS_DIR = Path("/run/netns")


class LabError(TopoError, RuntimeError):
    """The kernel refused part of a lab operation."""


def run(cmd: list[str], check: bool = True, input: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `cmd`; its CompletedProcess, or LabError with its output when it fails and `check`."""
    p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise LabError(f"{' '.join(cmd)}: {(p.stderr or p.stdout).strip()}")
    return p


def batch(tool: str, lines: list[str], ns: str | None = None, force: bool = False) -> str:
    """Run `lines` through `ip -batch` or `tc -batch` (in namespace `ns`); returns stderr."""
    if not lines:
        return ""
    cmd = [tool] + (["-n", ns] if ns else []) + (["-force"] if force else []) + ["-batch", "-"]
    p = run(cmd, check=False, input="\n".join(lines) + "\n")
    if p.returncode != 0 and not force:
        raise LabError(f"{tool}{' -n ' + ns if ns else ''}: {_batch_error(p.stderr, lines)}")
    return p.stderr


def _batch_error(stderr: str, lines: list[str]) -> str:
    msgs = [s for s in stderr.strip().splitlines() if not s.startswith("Warning")]
    for s in msgs:
        if s.startswith("Command failed -:"):
            try:
                n = int(s.rsplit(":", 1)[1])
                return f"{'; '.join(m for m in msgs if m != s)} (in `{lines[n - 1]}`)"
            except (ValueError, IndexError):
                break
    return "; ".join(msgs)


def ip_json(*args: str, ns: str | None = None) -> list:
    """`ip -j ARGS` (in namespace `ns`) parsed as JSON."""
    out = run(["ip"] + (["-n", ns] if ns else []) + ["-j", *args]).stdout
    return json.loads(out) if out.strip() else []


def tc_json(*args: str, ns: str | None = None) -> list:
    """`tc -j ARGS` (in namespace `ns`) parsed as JSON."""
    out = run(["tc"] + (["-n", ns] if ns else []) + ["-j", *args]).stdout
    return json.loads(out) if out.strip() else []


def list_netns(prefix: str = "") -> list[str]:
    """Named network namespaces starting with `prefix`, sorted."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def root_links(prefix: str) -> list[str]:
    """Root-namespace links whose names start with `prefix`."""
    return [ln["ifname"] for ln in ip_json("link", "show") if ln["ifname"].startswith(prefix)]


def netns_pids(namespaces: list[str]) -> dict[int, str]:
    """pid -> namespace, for every process whose network namespace is one of `namespaces`
    (what `ip netns pids` does, for many namespaces in one /proc scan)."""
    inodes = {}
    for ns in namespaces:
        try:
            inodes[os.stat(NETNS_DIR / ns).st_ino] = ns
        except OSError:
            pass
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ino = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            continue
        if ino in inodes:
            out[int(pid)] = inodes[ino]
    return out


def kill_pids(pids: list[int], grace: float = 2.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            if alive:
                time.sleep(0.02)
        if not alive:
            return
        pids = alive


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def has_netem(ns: str) -> bool:
    """Whether this kernel has sch_netem (probed on lo of `ns`, then removed)."""
    ok = run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "handle", "7:", "netem",
              "delay", "1ms"], check=False).returncode == 0
    if ok:
        run(["tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
    return ok
