"""Open vSwitch inside one lab host: its own ovsdb-server and ovs-vswitchd, run directory,
database and unixctl sockets, so several hosts' switches run side by side on one machine.

The kernel has no openvswitch module here, so bridges must use the userspace datapath
(`datapath_type=netdev`); `bridge()` makes one. Clients reach an instance with
`ovs-vsctl --db=unix:<rundir>/db.sock` and `ovs-appctl -t <rundir>/ovs-vswitchd.ctl`
(`Ovs.vsctl`, `Ovs.appctl`). Processes are found and stopped with the host namespace by
`lab down`, like sshd.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from topoctl.lab.netops import LabError

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")


@dataclass
class Ovs:
    """One lab host's Open vSwitch: its namespace and run directory (database and sockets)."""

    ns: str
    rundir: Path

    @property
    def db(self) -> str:
        """The OVSDB remote of this instance (`unix:` its socket)."""
        return f"unix:{self.rundir / 'db.sock'}"

    @property
    def env(self) -> dict[str, str]:
        """The environment that points the OVS tools at this instance's run directory."""
        d = str(self.rundir)
        return {**os.environ, "OVS_RUNDIR": d, "OVS_DBDIR": d, "OVS_LOGDIR": d}

    def vsctl(self, *args: str) -> str:
        """Run `ovs-vsctl ARGS` against this instance; its output."""
        return _run(["ovs-vsctl", f"--db={self.db}", "--timeout=10", *args], self.env)

    def appctl(self, target: str, *args: str) -> str:
        """Run `ovs-appctl -t TARGET ARGS` (ovs-vswitchd or ovsdb-server); its output."""
        return _run(["ovs-appctl", "-t", str(self.rundir / f"{target}.ctl"), *args], self.env)

    def bridge(self, name: str) -> None:
        """A userspace-datapath bridge (the only kind without the kernel module)."""
        self.vsctl("--may-exist", "add-br", name, "--", "set", "bridge", name,
                   "datapath_type=netdev")


def _run(cmd: list[str], env: dict[str, str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)
    if p.returncode != 0:
        raise LabError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p.stdout


def start(ns: str, rundir: Path, prefix: list[str] | None = None) -> Ovs:
    """Create a fresh database under `rundir` and start both daemons inside namespace `ns`;
    `prefix`: argv that puts them into the host's CPU group first (`Lab.join_prefix`)."""
    pre = list(prefix or [])
    rundir.mkdir(parents=True, exist_ok=True)
    o = Ovs(ns, rundir)
    db = rundir / "conf.db"
    if db.exists():
        db.unlink()
    _run(["ovsdb-tool", "create", str(db), str(SCHEMA)], o.env)
    common = ["--detach", "--no-chdir", "-vconsole:off", "-vsyslog:off", "-vfile:info"]
    _run([*pre, "ip", "netns", "exec", ns, "ovsdb-server", str(db),
          f"--remote=punix:{rundir}/db.sock", f"--pidfile={rundir}/ovsdb-server.pid",
          f"--unixctl={rundir}/ovsdb-server.ctl",
          f"--log-file={rundir}/ovsdb-server.log", *common], o.env)
    o.vsctl("--no-wait", "init")
    _run([*pre, "ip", "netns", "exec", ns, "ovs-vswitchd", o.db,
          f"--pidfile={rundir}/ovs-vswitchd.pid", f"--unixctl={rundir}/ovs-vswitchd.ctl",
          f"--log-file={rundir}/ovs-vswitchd.log", *common], o.env)
    return o


def pids(rundir: Path) -> list[int]:
    """Process ids of the ovs-vswitchd and ovsdb-server whose pid files are in `rundir`."""
    out = []
    for name in ("ovs-vswitchd", "ovsdb-server"):
        try:
            out.append(int((rundir / f"{name}.pid").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return out
