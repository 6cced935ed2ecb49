"""cluster.yaml: the machines, their NICs and how the NICs are cabled (the fabric).

One typed file read by two users: the planner (which wants the fabric as a capacitated graph) and
the lab (which builds it out of namespaces and shaped cables). Unknown keys are rejected and every
error names its YAML path (`hosts[3].nics[1].speed: ...`, `fabric.links[2].a: no host h9`), in the
style of the agent's HostState schema, whose scalar parsers (rates, MACs, interface names) are
reused so a rate means the same thing in a cluster file and in a plan.

Shape (see plans/*-cluster.yaml):

    apiVersion: topoctl/v1
    kind: Cluster
    name: hetero8
    defaults: {nic_speed: 100mbit, latency: 0ms, gpus: {count: 1, type: cpu}, ovs: false}
    gpu_types: {A100: {peak_flops: 312e12, memory_bandwidth: 1.555e12}}   # roofline table
    hosts:
      - {name: h0, rack: r0, gpus: {count: 1, type: A100}, ovs: true,
         nics: [{name: eth0, speed: 100mbit, mac: "02:00:00:00:00:01"}, {name: eth1}]}
    fabric:                       # kind direct: port-to-port cables (patch panel / OCS)
      kind: direct
      links: [{a: "h0:eth0", b: "h1:eth0", bandwidth: 50mbit, latency: 1ms, loss: 0.1%}]
    # fabric: {kind: switched, switches: [{name: tor0, uplink: spine, oversubscription: 2},
    #          {name: spine}], attach: [{port: h0, switch: tor0}]}     # star or leaf/spine
    bandwidth_matrix: {h0: {h1: 90mbit}}   # optional, measured/given; for planning only
    addressing: {management: 10.232.7.0/24}   # optional; the lab picks a free /24 otherwise
    inventory: {user: root, key: ~/.ssh/id_ed25519, ovsdb: unix:/run/openvswitch/db.sock}
    # bare metal (SSH): host addresses in hosts[].address; ovsdb: the agent's --ovsdb on every
    # host with ovs: true (hosts[].ovsdb overrides it per host)

Rates are per direction of a full-duplex link, in bit/s once parsed; latency is one-way, in
seconds once parsed; loss is a fraction. `Cluster.graph()` returns the fabric as plain data
(`FabricGraph`: hosts, switches, ports, links with capacity and latency) for code that should not
care how the file spelled it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, ValidationError
from pydantic import model_validator as _model_validator

from topoagent.protocol import API_VERSION
from topoagent.schema import Model
from topoagent.state import (
    IfName,
    IPv4,
    IPv4Net,
    Mac,
    Rate,
    StateError,
)

KIND = "Cluster"
if TYPE_CHECKING:
    from topoctl.fabric.graph import FabricGraph

LAB_MANAGEMENT = "10.232.0.0/16"  # README address table
DEFAULT_FABRIC_SUBNETS = "10.234.0.0/15"
DEFAULT_TRAINING_SUBNET = "10.236.0.0/16"


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
class Gpus(Model):
    """A host's accelerators: how many (ranks) and of which device type."""

    count: Annotated[int, Field(ge=0, le=1024)] = 1
    type: str = "cpu"  # `cpu`: cost measured on this CPU; other types look up gpu_types


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


class Inventory(Model):
    """How `topoctl apply/run` reach the hosts of a bare-metal cluster (hosts[].address).

    Plans carry it (metadata.inventory), so `topoctl apply plan.yaml` needs no flags. A lab
    named after the cluster, when it is up, still wins: it is the embedded default target."""

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


class Addressing(Model):
    """Address pools: the lab's management subnet, the fabric subnets and the training /32s."""

    management: IPv4Net | None = None  # the lab's management subnet (inside 10.232.0.0/16)
    fabric: IPv4Net = DEFAULT_FABRIC_SUBNETS  # planner: one subnet per cable / switch
    training: IPv4Net = DEFAULT_TRAINING_SUBNET  # planner: one /32 per host


class Cluster(Model):
    """A validated cluster file: hosts, fabric, GPU types, addressing and inventory."""

    model_config = Model.model_config | {"populate_by_name": True}

    api_version: Literal[API_VERSION] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["Cluster"] = KIND
    name: Name
    description: str = ""
    defaults: Defaults = Field(default_factory=Defaults)
    gpu_types: dict[str, GpuType] = Field(default_factory=dict)
    hosts: Annotated[list[Host], Field(min_length=1, max_length=4096)]
    fabric: Annotated[DirectFabric | SwitchedFabric, Field(discriminator="kind")]
    bandwidth_matrix: dict[Name, dict[Name, Rate]] | None = None
    addressing: Addressing = Field(default_factory=Addressing)
    inventory: Inventory | None = None

    @_model_validator(mode="after")
    def _cross_checks(self) -> Cluster:
        from topoctl.spec.cluster_checks import check_cluster  # checks read this schema

        problems = check_cluster(self)
        if problems:
            raise ClusterError(problems)
        return self

    # --- resolved views --------------------------------------------------------------------------
    def host(self, name: str) -> Host:
        """The host named `name` (KeyError when absent)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def gpus(self, host: str) -> Gpus:
        """`host`'s GPUs, or the defaults' when it names none."""
        return self.host(host).gpus or self.defaults.gpus

    def runs_ovs(self, host: str) -> bool:
        """Whether `host` runs Open vSwitch (its own `ovs`, else defaults.ovs)."""
        h = self.host(host)
        return self.defaults.ovs if h.ovs is None else h.ovs

    def ovsdb(self, host: str) -> str | None:
        """The OVSDB remote `host`'s agent is given (--ovsdb) on bare metal: hosts[].ovsdb, else
        inventory.ovsdb for a host that runs OVS; None: the agent's default."""
        h = self.host(host)
        if h.ovsdb is not None:
            return h.ovsdb
        if self.inventory is not None and self.inventory.ovsdb and self.runs_ovs(host):
            return self.inventory.ovsdb
        return None

    def inventory_doc(self) -> dict:
        """The inventory as plan data (`metadata.inventory`): transport settings, each host's
        address and, for hosts with one, the OVSDB remote their agent gets (`ovsdb: {host:
        remote}`)."""
        inv = (self.inventory or Inventory()).model_dump(mode="json", exclude_none=True)
        ovsdb = {h.name: db for h in self.hosts if (db := self.ovsdb(h.name))}
        return inv | {"addresses": {h.name: h.address for h in self.hosts if h.address},
                      **({"ovsdb": ovsdb} if ovsdb else {})}

    def nic_speed(self, host: str, nic: str) -> int:
        """Speed in bit/s of `host`'s NIC `nic` (its own, else defaults.nic_speed)."""
        for n in self.host(host).nics:
            if n.name == nic:
                return n.speed or self.defaults.nic_speed  # type: ignore[return-value]
        raise KeyError(f"{host}:{nic}")

    def graph(self) -> FabricGraph:
        """The fabric as plain data; see `topoctl.fabric.graph.FabricGraph`."""
        from topoctl.fabric.graph import fabric_graph  # the view is built from this schema

        return fabric_graph(self)

    def attachments(self) -> list[tuple[str, Attach]]:
        """(HOST:NIC, attach entry) for every NIC attached to a switch, bare-host entries
        expanded; only for switched fabrics."""
        return _attachments_of(self)

    def with_fabric(self, fabric: Any, prefix: str = "fabric") -> Cluster:
        """This cluster re-cabled: `fabric` is a fabric mapping as in the file (a plan's `fabric`
        wiring); validated against these hosts, errors under `prefix`."""
        data = self.to_dict()
        data["fabric"] = fabric
        try:
            return Cluster.model_validate(data)
        except ValidationError as e:
            from topoctl.spec.cluster_load import cluster_problems

            probs = cluster_problems(e)
            raise ClusterError([(prefix + p.removeprefix("fabric"), m) if p.startswith("fabric")
                                else (p, m) for p, m in probs]) from None

    def to_dict(self) -> dict:
        """The cluster as cluster-file data (aliases, no unset values)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _attachments_of(c: Cluster) -> list[tuple[str, Attach]]:
    """(HOST:NIC, attach entry) for every attached NIC, bare-host entries expanded."""
    f = c.fabric
    assert isinstance(f, SwitchedFabric)
    if not f.attach and len(f.switches) == 1:
        at = Attach(port="*", switch=f.switches[0].name)
        return [(f"{h.name}:{n.name}", at) for h in c.hosts for n in h.nics]
    nics = {h.name: [n.name for n in h.nics] for h in c.hosts}
    out = []
    for at in f.attach:
        if ":" in at.port:
            out.append((at.port, at))
        else:
            out += [(f"{at.port}:{n}", at) for n in nics.get(at.port, [])]
    return out
