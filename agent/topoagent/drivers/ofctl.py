"""OpenFlow through `ovs-ofctl`: the agent's flows (cookie OVS_COOKIE) and select groups (ids
from OVS_GROUP_BASE) on one bridge, read back in the canonical text ovs-ofctl prints and
replaced in one atomic OpenFlow 1.5 bundle (`ovs-ofctl bundle`: flow and group mods in one
transaction). Foreign flows and groups are never named by a mod, so they are untouched.
(`replace-flows` would replace the whole table, foreign flows included, and cannot carry group
mods; the bundle restricted by cookie is the same atomic replace of the agent's part.)"""

from __future__ import annotations

import subprocess
import tempfile

from topoagent.protocol import TopoError
from topoagent.state.ovs import OVS_COOKIE, OVS_GROUP_BASE

GROUP_SPAN = 0x10000


class OfctlError(TopoError, RuntimeError):
    """ovs-ofctl refused a request or could not reach ovs-vswitchd."""


def _run(args: list[str], input_file: str | None = None) -> str:
    p = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "--names", *args], capture_output=True,
                       text=True, timeout=30)
    if p.returncode != 0:
        raise OfctlError(f"ovs-ofctl {' '.join(args[:1])}: {p.stderr.strip()}")
    return p.stdout


def mgmt(rundir: str, bridge: str) -> str:
    """The OpenFlow management socket of `bridge` in `rundir`."""
    return f"unix:{rundir}/{bridge}.mgmt"


def dump(rundir: str, bridge: str) -> tuple[frozenset[str], frozenset[str]]:
    """(the agent's flows, the agent's groups) in canonical text."""
    sw = mgmt(rundir, bridge)
    flows = set()
    for line in _run(["--no-stats", "dump-flows", sw, f"cookie={OVS_COOKIE:#x}/-1"]).splitlines():
        line = line.strip()
        if line.startswith(f"cookie={OVS_COOKIE:#x}, "):
            flows.add(line.split(", ", 1)[1])
    groups = set()
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "--names", "dump-groups", sw],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise OfctlError(f"ovs-ofctl dump-groups: {out.stderr.strip()}")
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("group_id="):
            gid = int(line.split(",", 1)[0].split("=", 1)[1])
            if OVS_GROUP_BASE <= gid < OVS_GROUP_BASE + GROUP_SPAN:
                groups.add(line)
    return frozenset(flows), frozenset(groups)


def replace(rundir: str, bridge: str, flows: frozenset[str], groups: frozenset[str],
            old_flows: frozenset[str], old_groups: frozenset[str]) -> None:
    """One bundle: drop the agent's flows, then its old groups, add the new groups, then the
    new flows (a group must exist before a flow points at it, and lose its flows first)."""
    lines = []
    if old_flows:
        lines.append(f"flow delete cookie={OVS_COOKIE:#x}/-1")
    lines += [f"group delete {g.split(',', 1)[0]}" for g in sorted(old_groups)]
    lines += [f"group add {g}" for g in sorted(groups)]
    lines += [f"flow add cookie={OVS_COOKIE:#x}," + f.replace(" actions=", ",actions=")
              for f in sorted(flows)]
    if not lines:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".ofctl") as fh:
        fh.write("\n".join(lines) + "\n")
        fh.flush()
        _run(["bundle", mgmt(rundir, bridge), fh.name])
