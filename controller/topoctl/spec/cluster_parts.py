"""The pieces of a cluster file: its scalars (names, durations, loss rates, port references) and
every section's model except the whole file's (`topoctl.spec.cluster.Cluster`).

Kept apart from `Cluster` so the cross-checks (`spec.cluster_checks`), which `Cluster` runs,
read these models without importing the module that imports them."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer

from topoagent.state.host import StateError
from topoagent.state.schema import Model
from topoagent.state.values import IfName, IPv4, IPv4Net, Mac, Rate, ip_network
from topoctl.spec.interconnect import KINDS

LAB_MANAGEMENT = "10.232.0.0/16"  # README address table
DEFAULT_FABRIC_SUBNETS = "10.234.0.0/15"
DEFAULT_TRAINING_SUBNET = "10.236.0.0/16"
# IPv6 pools: the unique local range fd74:6f70:6f63::/48 (RFC 4193), whose 40-bit global ID
# 74 6f 70 6f 63 is ASCII "topoc" (topoctl): one /64 per cable or switched domain from the upper
# half, one /128 per host from subnet 1 (docs/planner.md "Addressing")
TOPOCTL_ULA = "fd74:6f70:6f63::/48"
DEFAULT_FABRIC6_SUBNETS = "fd74:6f70:6f63:8000::/49"
DEFAULT_TRAINING6_SUBNET = "fd74:6f70:6f63:1::/64"
FAMILIES = ("ipv4", "ipv6", "dual")
# an IPv6-only lab's management addresses: its IPv4 management address in the low 32 bits
LAB_MANAGEMENT6 = "fd74:6f70:6f63:2::/96"


class ClusterError(StateError):
    """An invalid cluster file; `problems` is a list of (yaml_path, message)."""


# --- scalars -------------------------------------------------------------------------------------
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|ms|us|ns)?\s*$")
_DURATION_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def _name(v: str) -> str:
    if not isinstance(v, str) or not _NAME.match(v):
        raise ValueError(f"not a name (lowercase letters, digits and inner '-', 1-32): {v!r}")
    return v


def _nic_name(v: str) -> str:
    if v == "lo" or v.startswith("tp"):
        raise ValueError(f"{v!r} is reserved (lo, and names starting with tp are topoctl's own)")
    return v


def parse_duration(v: Any) -> float:
    """`1ms`, `250us`, `0.5s`, `0` or a number of seconds -> seconds (float, 0 .. 10 s)."""
    if isinstance(v, bool):
        raise ValueError(f"not a duration: {v!r}")
    if isinstance(v, int | float):
        secs = float(v)
    else:
        m = _DURATION.match(str(v))
        if not m:
            raise ValueError(f"not a duration (e.g. 1ms, 250us): {v!r}")
        secs = float(m.group(1)) * _DURATION_SCALE[m.group(2) or "s"]
    if not 0 <= secs <= 10:
        raise ValueError(f"duration out of range (0 .. 10s): {v!r}")
    return secs


def format_duration(secs: float) -> str:
    """Seconds as the shortest cluster-file duration (`1.5ms`, `20us`)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if secs >= scale or unit == "us":
            return f"{secs / scale:g}{unit}"
    return "0s"  # pragma: no cover


def parse_loss(v: Any) -> float:
    """A fraction 0..1, or a percentage string `0.5%`."""
    if isinstance(v, bool):
        raise ValueError(f"not a loss rate: {v!r}")
    s = str(v).strip()
    try:
        frac = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise ValueError(f"not a loss rate (a fraction 0..1 or a percentage like 0.5%): {v!r}") \
            from None
    if not 0 <= frac < 1:
        raise ValueError(f"loss out of range (0 <= loss < 1): {v!r}")
    return frac


def parse_port_ref(v: Any) -> tuple[str, str]:
    """`host:nic` -> (host, nic)."""
    s = str(v)
    host, sep, nic = s.partition(":")
    if not sep or not host or not nic or ":" in nic:
        raise ValueError(f"not a port (HOST:NIC, e.g. h0:eth0): {v!r}")
    return host, nic


def _port_ref(v: Any) -> str:
    parse_port_ref(v)
    return str(v)


Name = Annotated[str, AfterValidator(_name)]
OVSDB_REMOTE = re.compile(r"^(unix:/[^\s]+|(tcp|ssl):[^\s:]+:\d{1,5})$")


def _ovsdb_remote(v: str) -> str:
    if not OVSDB_REMOTE.match(v):
        raise ValueError(f"not an OVSDB remote (unix:/PATH, tcp:HOST:PORT or ssl:HOST:PORT): "
                         f"{v!r}")
    return v


OvsdbRemote = Annotated[str, AfterValidator(_ovsdb_remote)]
NicName = Annotated[IfName, AfterValidator(_nic_name)]
Duration = Annotated[float, BeforeValidator(parse_duration),
                     PlainSerializer(format_duration, return_type=str)]
Loss = Annotated[float, BeforeValidator(parse_loss)]
PortRef = Annotated[str, BeforeValidator(_port_ref)]


# --- the schema ----------------------------------------------------------------------------------
class DeviceLink(Model):
    """The interconnect among a host's devices (NVLink, PCIe, the lab's loopback): `kind`
    picks datasheet figures (`topoctl.spec.interconnect.KINDS`), `bandwidth` (per device,
    per direction) and `latency` override them. Default: the device type's own."""

    kind: Literal[tuple(KINDS)] | None = None  # type: ignore[valid-type]
    bandwidth: Rate | None = None
    latency: Duration | None = None


class Gpus(Model):
    """A host's accelerators: how many (ranks), of which device type, the link among them, and
    how they reach the fabric: `nics: shared` (every device through any of the host's NICs)
    or `rails` (device i through the host's NIC i: rail-optimised fabrics, where NIC i of
    every host is on rail switch i)."""

    count: Annotated[int, Field(ge=0, le=1024)] = 1
    type: str = "cpu"  # `cpu`: cost measured on this CPU; other types look up gpu_types
    link: DeviceLink | None = None  # default: the device type's (`spec.interconnect`)
    nics: Literal["shared", "rails"] = "shared"


class GpuType(Model):
    """Roofline numbers for one device type (planner cost model)."""

    peak_flops: Annotated[float, Field(gt=0)]  # FLOP/s
    memory_bandwidth: Annotated[float, Field(gt=0)]  # bytes/s
    memory: Annotated[float, Field(gt=0)] | None = None  # bytes per device (placement limit)


class Nic(Model):
    """One NIC of a host: name, MAC and speed (default: defaults.nic_speed)."""

    name: NicName
    mac: Mac | None = None
    speed: Rate | None = None  # default: defaults.nic_speed


class Host(Model):
    """One machine: its NICs, GPUs, rack label, management address and whether it runs Open
    vSwitch."""

    name: Name
    gpus: Gpus | None = None  # default: defaults.gpus
    rack: Name | None = None  # a label for planners and reports
    address: IPv4 | None = None  # bare metal: the SSH/management address (the lab assigns its own)
    ovs: bool | None = None  # runs its own Open vSwitch (default: defaults.ovs)
    # bare metal: this host's ovsdb-server, passed to its agent as --ovsdb (default:
    # inventory.ovsdb, else the agent's own default); only for hosts that run OVS
    ovsdb: OvsdbRemote | None = None
    nics: Annotated[list[Nic], Field(min_length=1)]
    # relative compute speed of this host's ranks (1: as fast as the job's step was timed; 0.5:
    # half as fast). The lab enforces it with a CPU quota; the planner scales `cpu` hosts' op
    # times by 1/speed; batch shares follow it. Default 1.
    speed: Annotated[float, Field(gt=0, le=16)] | None = None


class Inventory(Model):
    """How `topoctl apply/run` reach the hosts of a bare-metal cluster (hosts[].address).

    `topoctl apply/run ... --cluster FILE` reach the hosts with it. Plans carry a copy
    (metadata.inventory) that is only checked against the cluster file's, never used on its
    own (docs/agent.md, trust model). A lab named after the cluster, when it is up, still
    wins: it is the embedded default target."""

    transport: Literal["ssh"] = "ssh"  # (the lab and --local need no inventory)
    user: str = "root"
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    key: str = "~/.ssh/id_ed25519"  # private key (key auth only)
    known_hosts: str = "~/.ssh/known_hosts"  # strict host-key checking against this file
    agent: list[str] = Field(default_factory=lambda: ["topo-agent"])  # the remote command
    # the ovsdb-server of every host that runs OVS (`--ovsdb`; hosts[].ovsdb overrides it);
    # default: the agent's own ($TOPO_OVSDB, else unix:/run/openvswitch/db.sock)
    ovsdb: OvsdbRemote | None = None


class Defaults(Model):
    """Values hosts, NICs and cables take when they do not say: GPUs, NIC speed, latency, loss,
    OVS."""

    gpus: Gpus = Field(default_factory=Gpus)
    nic_speed: Rate | None = None
    latency: Duration = 0.0
    loss: Loss = 0.0
    ovs: bool = False


class Link(Model):
    """One cable between two host ports; bandwidth defaults to the slower NIC's speed."""

    a: PortRef
    b: PortRef
    bandwidth: Rate | None = None
    latency: Duration | None = None
    loss: Loss | None = None


class DirectFabric(Model):
    """Each host port is patched to at most one other host port (patch panel, OCS).

    `links` may be empty: a topology strategy then chooses the cabling per job."""

    kind: Literal["direct"]
    mtu: Annotated[int, Field(ge=576, le=9000)] = 1500
    links: list[Link] = Field(default_factory=list)


class Switch(Model):
    """A switch; with `uplink` it is a leaf whose uplink to the named switch has
    `uplink_bandwidth`, or the sum of its attached ports divided by `oversubscription`."""

    name: Name
    uplink: Name | None = None
    uplink_bandwidth: Rate | None = None
    oversubscription: Annotated[float, Field(ge=1, le=1024)] | None = None
    latency: Duration | None = None  # of the uplink


class Attach(Model):
    """`port` (HOST:NIC, or a bare HOST for all its NICs) is cabled to `switch`."""

    port: str
    switch: Name
    bandwidth: Rate | None = None
    latency: Duration | None = None
    loss: Loss | None = None


class SwitchedFabric(Model):
    """Hosts' NICs attach to switches: a star, or two levels (leaves with an uplink to a spine).

    With one switch and no `attach`, every NIC attaches to it."""

    kind: Literal["switched"]
    mtu: Annotated[int, Field(ge=576, le=9000)] = 1500
    switches: Annotated[list[Switch], Field(min_length=1)]
    attach: list[Attach] = Field(default_factory=list)


def _ipv6_network(v: Any) -> str:
    """An IPv6 network with host bits clear (the agent's parser), never an IPv4 one."""
    s = ip_network(v)
    if ":" not in s:
        raise ValueError(f"not an IPv6 network: {v!r}")
    return s


IPv6Net = Annotated[str, AfterValidator(_ipv6_network)]


class Addressing(Model):
    """Address pools: the lab's management subnet, the fabric subnets and the training /32s;
    `family` picks the fabric's and training's address family: ipv4 (default), ipv6 (fabric6
    and training6 only) or dual (both on every host; training, QoS classes and policy routes
    in IPv6, the IPv4 routes beside them)."""

    management: IPv4Net | None = None  # the lab's management subnet (inside 10.232.0.0/16)
    family: Literal["ipv4", "ipv6", "dual"] = "ipv4"
    fabric: IPv4Net = DEFAULT_FABRIC_SUBNETS  # planner: one subnet per cable / switch
    training: IPv4Net = DEFAULT_TRAINING_SUBNET  # planner: one /32 per host
    fabric6: IPv6Net = DEFAULT_FABRIC6_SUBNETS  # planner: one /64 per cable / switch
    training6: IPv6Net = DEFAULT_TRAINING6_SUBNET  # planner: one /128 per host
