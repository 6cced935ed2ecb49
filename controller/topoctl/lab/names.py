"""Names of everything a lab creates, derived from the lab name alone.

Every namespace and root-namespace link of lab `demo` starts with `tp-demo-`, so many labs coexist
and `topoctl lab down demo` after a crash finds its leftovers by that prefix without any state
file. Test namespaces use `tpt-` (tests/netns.py), which no lab prefix can produce. Link names
must fit the kernel's 15 characters, hence the short lab names (<= 9) and base-36 host indices.
"""

from __future__ import annotations

import hashlib
import re

from topoagent.protocol import TopoError

LAB_NAME = re.compile(r"^[a-z][a-z0-9]{0,8}$")
MGMT_IF = "tpmgmt"  # the management interface inside each host namespace
IFNAMSIZ = 15


class LabNameError(TopoError, ValueError):
    """A lab name that cannot be one (bad input: `--lab`, `--name`, $TOPOCTL_LAB, a cluster's
    `name`); a ValueError too, for callers that validate names as values."""


def check_lab_name(name: str, source: str = "") -> str:
    """`name` if it is a valid lab name (1-9 lowercase letters/digits, a letter first);
    LabNameError (naming `source`, the flag or file it came from) otherwise."""
    if not isinstance(name, str) or not LAB_NAME.match(name):
        raise LabNameError(f"lab name {name!r}: 1-9 lowercase letters/digits, starting with a "
                           f"letter", source=source)
    return name


def prefix(lab: str) -> str:
    """Prefix of every namespace and root link of this lab."""
    return f"tp-{lab}-"


def host_ns(lab: str, host: str) -> str:
    """The namespace of `host` in lab `lab`."""
    return f"tp-{lab}-h-{host}"


def cpu_group(lab: str, host: str) -> str:
    """The CPU group (cgroup) of `host` in lab `lab`: named as its namespace."""
    return host_ns(lab, host)


def wire_ns(lab: str) -> str:
    """The lab's wire namespace (the patch panel)."""
    return f"tp-{lab}-wire"


def mgmt_bridge(lab: str) -> str:
    """The lab's management bridge in the root namespace."""
    return f"tp-{lab}-br"


def _b36(i: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        i, r = divmod(i, 36)
        out = digits[r] + out
        if i == 0:
            return out


def mgmt_root_if(lab: str, index: int) -> str:
    """Root-namespace end of host `index`'s management veth (enslaved to the bridge)."""
    name = f"tp-{lab}-{_b36(index)}"
    if len(name) > IFNAMSIZ:
        raise ValueError(f"lab {lab!r} is too long for {index + 1} hosts (link name {name})")
    return name


def wire_end(index: int) -> str:
    """Wire-namespace end of host port `index` (ports numbered in cluster order)."""
    return f"e{index}"


def switch_port(index: int) -> tuple[str, str]:
    """(shaped end, bridge port) of the veth pair that joins port `index` to its switch."""
    return f"a{index}", f"b{index}"


def switch_bridge(index: int) -> str:
    """The bridge name of switch number `index` (inside the wire namespace)."""
    return f"s{index}"


def uplink(index: int) -> tuple[str, str]:
    """(leaf end, spine end) of switch `index`'s uplink."""
    return f"u{index}", f"v{index}"


def port_mac(lab: str, host: str, nic: str) -> str:
    """Stable, locally administered MAC for a host port the cluster gives no MAC for."""
    h = hashlib.sha256(f"{lab}/{host}/{nic}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in h[:5])
