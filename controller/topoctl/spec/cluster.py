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

Rates are per direction of a full-duplex link, in bit/s once parsed; latency is one-way, in
seconds once parsed; loss is a fraction. `Cluster.graph()` returns the fabric as plain data
(`FabricGraph`: hosts, switches, ports, links with capacity and latency) for code that should not
care how the file spelled it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, ValidationError
from pydantic import model_validator as _model_validator

from topoagent.state import (
    IfName,
    IPv4,
    IPv4Net,
    Mac,
    Rate,
    StateError,
    _Model,
    _problems,
    format_rate,
    load_yaml_file,
)

API_VERSION = "topoctl/v1"
KIND = "Cluster"
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
NicName = Annotated[IfName, AfterValidator(_nic_name)]
Duration = Annotated[float, BeforeValidator(parse_duration),
                     PlainSerializer(format_duration, return_type=str)]
Loss = Annotated[float, BeforeValidator(parse_loss)]
PortRef = Annotated[str, BeforeValidator(_port_ref)]


# --- the schema ----------------------------------------------------------------------------------
class Gpus(_Model):
    count: Annotated[int, Field(ge=0, le=1024)] = 1
    type: str = "cpu"  # `cpu`: cost measured on this CPU; other types look up gpu_types


class GpuType(_Model):
    """Roofline numbers for one device type (planner cost model)."""

    peak_flops: Annotated[float, Field(gt=0)]  # FLOP/s
    memory_bandwidth: Annotated[float, Field(gt=0)]  # bytes/s


class Nic(_Model):
    name: NicName
    mac: Mac | None = None
    speed: Rate | None = None  # default: defaults.nic_speed


class Host(_Model):
    name: Name
    gpus: Gpus | None = None  # default: defaults.gpus
    rack: Name | None = None  # a label for planners and reports
    address: IPv4 | None = None  # bare metal: the SSH/management address (the lab assigns its own)
    ovs: bool | None = None  # runs its own Open vSwitch (default: defaults.ovs)
    nics: Annotated[list[Nic], Field(min_length=1)]


class Inventory(_Model):
    """How `topoctl apply/run` reach the hosts of a bare-metal cluster (hosts[].address).

    Plans carry it (metadata.inventory), so `topoctl apply plan.yaml` needs no flags. A lab
    named after the cluster, when it is up, still wins: it is the embedded default target."""

    transport: Literal["ssh"] = "ssh"  # (the lab and --local need no inventory)
    user: str = "root"
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    key: str = "~/.ssh/id_ed25519"  # private key (key auth only)
    known_hosts: str = "~/.ssh/known_hosts"  # strict host-key checking against this file
    agent: list[str] = Field(default_factory=lambda: ["topo-agent"])  # the remote command


class Defaults(_Model):
    gpus: Gpus = Field(default_factory=Gpus)
    nic_speed: Rate | None = None
    latency: Duration = 0.0
    loss: Loss = 0.0
    ovs: bool = False


class Link(_Model):
    """One cable between two host ports; bandwidth defaults to the slower NIC's speed."""

    a: PortRef
    b: PortRef
    bandwidth: Rate | None = None
    latency: Duration | None = None
    loss: Loss | None = None


class DirectFabric(_Model):
    """Each host port is patched to at most one other host port (patch panel, OCS).

    `links` may be empty: a topology strategy then chooses the cabling per job."""

    kind: Literal["direct"]
    mtu: Annotated[int, Field(ge=576, le=9000)] = 1500
    links: list[Link] = Field(default_factory=list)


class Switch(_Model):
    """A switch; with `uplink` it is a leaf whose uplink to the named switch has
    `uplink_bandwidth`, or the sum of its attached ports divided by `oversubscription`."""

    name: Name
    uplink: Name | None = None
    uplink_bandwidth: Rate | None = None
    oversubscription: Annotated[float, Field(ge=1, le=1024)] | None = None
    latency: Duration | None = None  # of the uplink


class Attach(_Model):
    """`port` (HOST:NIC, or a bare HOST for all its NICs) is cabled to `switch`."""

    port: str
    switch: Name
    bandwidth: Rate | None = None
    latency: Duration | None = None
    loss: Loss | None = None


class SwitchedFabric(_Model):
    """Hosts' NICs attach to switches: a star, or two levels (leaves with an uplink to a spine).

    With one switch and no `attach`, every NIC attaches to it."""

    kind: Literal["switched"]
    mtu: Annotated[int, Field(ge=576, le=9000)] = 1500
    switches: Annotated[list[Switch], Field(min_length=1)]
    attach: list[Attach] = Field(default_factory=list)


class Addressing(_Model):
    management: IPv4Net | None = None  # the lab's management subnet (inside 10.232.0.0/16)
    fabric: IPv4Net = DEFAULT_FABRIC_SUBNETS  # planner: one subnet per cable / switch
    training: IPv4Net = DEFAULT_TRAINING_SUBNET  # planner: one /32 per host


class Cluster(_Model):
    model_config = _Model.model_config | {"populate_by_name": True}

    api_version: Literal["topoctl/v1"] = Field(API_VERSION, alias="apiVersion")
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
        problems = _check(self)
        if problems:
            raise ClusterError(problems)
        return self

    # --- resolved views --------------------------------------------------------------------------
    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def gpus(self, host: str) -> Gpus:
        return self.host(host).gpus or self.defaults.gpus

    def runs_ovs(self, host: str) -> bool:
        h = self.host(host)
        return self.defaults.ovs if h.ovs is None else h.ovs

    def nic_speed(self, host: str, nic: str) -> int:
        for n in self.host(host).nics:
            if n.name == nic:
                return n.speed or self.defaults.nic_speed  # type: ignore[return-value]
        raise KeyError(f"{host}:{nic}")

    def graph(self) -> FabricGraph:
        """The fabric as plain data; see FabricGraph."""
        return _graph(self)

    def with_fabric(self, fabric: Any, prefix: str = "fabric") -> Cluster:
        """This cluster re-cabled: `fabric` is a fabric mapping as in the file (a plan's `fabric`
        wiring); validated against these hosts, errors under `prefix`."""
        data = self.to_dict()
        data["fabric"] = fabric
        try:
            return Cluster.model_validate(data)
        except ValidationError as e:
            probs = _cluster_problems(e)
            raise ClusterError([(prefix + p.removeprefix("fabric"), m) if p.startswith("fabric")
                                else (p, m) for p, m in probs]) from None

    def to_dict(self) -> dict:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- plain-data view -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Port:
    host: str
    nic: str
    speed: int  # bit/s
    mac: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.host}:{self.nic}"


@dataclass(frozen=True)
class FabricLink:
    """A full-duplex link; `capacity` is per direction. Host ends name their NIC (`a_nic`),
    switch ends have None. kind: `cable` (host-host), `access` (host-switch), `uplink`."""

    a: str
    b: str
    capacity: int  # bit/s, each direction
    latency: float = 0.0  # seconds, one way
    loss: float = 0.0
    a_nic: str | None = None
    b_nic: str | None = None
    kind: Literal["cable", "access", "uplink"] = "cable"


@dataclass(frozen=True)
class FabricGraph:
    """Nodes are host and switch names (disjoint); links are full duplex. Parallel links between
    the same two nodes are kept (merge them yourself if you want one arc)."""

    kind: Literal["direct", "switched"]
    hosts: tuple[str, ...]
    switches: tuple[str, ...] = ()
    ports: tuple[Port, ...] = ()
    links: tuple[FabricLink, ...] = ()
    mtu: int = 1500
    _adj: dict = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("_adj")
        return d

    def neighbours(self, node: str) -> list[tuple[str, FabricLink]]:
        if not self._adj:
            for ln in self.links:
                self._adj.setdefault(ln.a, []).append((ln.b, ln))
                self._adj.setdefault(ln.b, []).append((ln.a, ln))
        return list(self._adj.get(node, []))

    def is_connected(self) -> bool:
        """True if every host reaches every other host."""
        if not self.hosts:
            return True
        seen, todo = {self.hosts[0]}, [self.hosts[0]]
        while todo:
            for nb, _ in self.neighbours(todo.pop()):
                if nb not in seen:
                    seen.add(nb)
                    todo.append(nb)
        return all(h in seen for h in self.hosts)


def _graph(c: Cluster) -> FabricGraph:
    d = c.defaults
    ports = tuple(Port(h.name, n.name, n.speed or d.nic_speed, n.mac)  # type: ignore[arg-type]
                  for h in c.hosts for n in h.nics)
    speed = {p.ref: p.speed for p in ports}
    hosts = tuple(h.name for h in c.hosts)
    f = c.fabric
    if isinstance(f, DirectFabric):
        links = []
        for ln in f.links:
            (ah, an), (bh, bn) = parse_port_ref(ln.a), parse_port_ref(ln.b)
            cap = ln.bandwidth or min(speed[ln.a], speed[ln.b])
            links.append(FabricLink(ah, bh, cap, _pick(ln.latency, d.latency),
                                    _pick(ln.loss, d.loss), an, bn, "cable"))
        return FabricGraph("direct", hosts, (), ports, tuple(links), f.mtu)
    links, down = [], {s.name: 0 for s in f.switches}
    for ref, at in _attachments(c):
        h, n = parse_port_ref(ref)
        cap = at.bandwidth or speed[ref]
        down[at.switch] += cap
        links.append(FabricLink(h, at.switch, cap, _pick(at.latency, d.latency),
                                _pick(at.loss, d.loss), n, None, "access"))
    for s in f.switches:
        if s.uplink:
            cap = s.uplink_bandwidth or max(1, int(down[s.name] / (s.oversubscription or 1)))
            links.append(FabricLink(s.name, s.uplink, cap, _pick(s.latency, d.latency), 0.0,
                                    None, None, "uplink"))
    return FabricGraph("switched", hosts, tuple(s.name for s in f.switches), ports, tuple(links),
                       f.mtu)


def _pick(v: float | None, default: float) -> float:
    return default if v is None else v


def _attachments(c: Cluster) -> list[tuple[str, Attach]]:
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


# --- cross-checks (each problem with its YAML path) -----------------------------------------------
def _check(c: Cluster) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    hosts: dict[str, int] = {}
    for i, h in enumerate(c.hosts):
        if h.name in hosts:
            problems.append((f"hosts[{i}].name", f"{h.name} is also hosts[{hosts[h.name]}]"))
        hosts.setdefault(h.name, i)
        seen: dict[str, int] = {}
        for j, n in enumerate(h.nics):
            if n.name in seen:
                problems.append((f"hosts[{i}].nics[{j}].name",
                                 f"{n.name} is also hosts[{i}].nics[{seen[n.name]}]"))
            seen.setdefault(n.name, j)
            if n.speed is None and c.defaults.nic_speed is None:
                problems.append((f"hosts[{i}].nics[{j}].speed",
                                 "missing (and no defaults.nic_speed)"))
        g = h.gpus or c.defaults.gpus
        if g.type != "cpu" and c.gpu_types and g.type not in c.gpu_types:
            problems.append((f"hosts[{i}].gpus.type",
                             f"{g.type} is not in gpu_types ({', '.join(sorted(c.gpu_types))})"))
    if c.defaults.gpus.type != "cpu" and c.gpu_types and c.defaults.gpus.type not in c.gpu_types:
        problems.append(("defaults.gpus.type", f"{c.defaults.gpus.type} is not in gpu_types"))
    if problems:
        return problems
    nics = {h.name: {n.name: n for n in h.nics} for h in c.hosts}

    def port(path: str, ref: str) -> bool:
        h, n = parse_port_ref(ref)
        if h not in nics:
            problems.append((path, f"no host {h}"))
            return False
        if n not in nics[h]:
            problems.append((path, f"host {h} has no NIC {n} ({', '.join(nics[h])})"))
            return False
        return True

    def speed(ref: str) -> int:
        h, n = parse_port_ref(ref)
        return nics[h][n].speed or c.defaults.nic_speed  # type: ignore[return-value]

    used: dict[str, str] = {}

    def use(path: str, ref: str) -> None:
        if ref in used:
            problems.append((path, f"{ref} is already cabled at {used[ref]}"))
        used.setdefault(ref, path)

    f = c.fabric
    if isinstance(f, DirectFabric):
        for i, ln in enumerate(f.links):
            ok = [port(f"fabric.links[{i}].{e}", getattr(ln, e)) for e in ("a", "b")]
            if not all(ok):
                continue
            if parse_port_ref(ln.a)[0] == parse_port_ref(ln.b)[0]:
                problems.append((f"fabric.links[{i}]", "both ends on the same host"))
            use(f"fabric.links[{i}].a", ln.a)
            use(f"fabric.links[{i}].b", ln.b)
            slow = min(speed(ln.a), speed(ln.b))
            if ln.bandwidth and ln.bandwidth > slow:
                problems.append((f"fabric.links[{i}].bandwidth",
                                 f"{format_rate(ln.bandwidth)} is above the NIC speed "
                                 f"{format_rate(slow)}"))
    else:
        sw = {s.name: i for i, s in enumerate(f.switches)}
        for i, s in enumerate(f.switches):
            if sw[s.name] != i:
                problems.append((f"fabric.switches[{i}].name",
                                 f"{s.name} is also fabric.switches[{sw[s.name]}]"))
            if s.name in nics:
                problems.append((f"fabric.switches[{i}].name", f"{s.name} is also a host name"))
            if s.uplink is not None:
                if s.uplink not in sw:
                    problems.append((f"fabric.switches[{i}].uplink", f"no switch {s.uplink}"))
                elif s.uplink == s.name or f.switches[sw[s.uplink]].uplink is not None:
                    problems.append((f"fabric.switches[{i}].uplink",
                                     "must name a top-level switch (two levels at most)"))
                if s.uplink_bandwidth is not None and s.oversubscription is not None:
                    problems.append((f"fabric.switches[{i}]",
                                     "give uplink_bandwidth or oversubscription, not both"))
            elif s.uplink_bandwidth is not None or s.oversubscription is not None:
                problems.append((f"fabric.switches[{i}]",
                                 "uplink_bandwidth/oversubscription need an uplink"))
        if not f.attach and len(f.switches) > 1:
            problems.append(("fabric.attach", "needed when there is more than one switch"))
        for i, at in enumerate(f.attach):
            path = f"fabric.attach[{i}]"
            if at.switch not in sw:
                problems.append((f"{path}.switch", f"no switch {at.switch}"))
            if ":" in at.port:
                try:
                    parse_port_ref(at.port)
                except ValueError as e:
                    problems.append((f"{path}.port", str(e)))
                    continue
                refs = [at.port] if port(f"{path}.port", at.port) else []
            elif at.port in nics:
                refs = [f"{at.port}:{n}" for n in nics[at.port]]
            else:
                problems.append((f"{path}.port", f"no host {at.port}"))
                continue
            for ref in refs:
                use(f"{path}.port", ref)
                if at.bandwidth and at.bandwidth > speed(ref):
                    problems.append((f"{path}.bandwidth",
                                     f"{format_rate(at.bandwidth)} is above the NIC speed "
                                     f"{format_rate(speed(ref))} of {ref}"))
    if c.bandwidth_matrix:
        for src, row in c.bandwidth_matrix.items():
            if src not in nics:
                problems.append((f"bandwidth_matrix.{src}", f"no host {src}"))
            for dst in row:
                if dst not in nics:
                    problems.append((f"bandwidth_matrix.{src}.{dst}", f"no host {dst}"))
                elif dst == src:
                    problems.append((f"bandwidth_matrix.{src}.{dst}", "a host to itself"))
    mgmt = c.addressing.management
    if mgmt is not None:
        net = ipaddress.IPv4Network(mgmt)
        if not net.subnet_of(ipaddress.IPv4Network(LAB_MANAGEMENT)):
            problems.append(("addressing.management", f"{mgmt} is outside {LAB_MANAGEMENT}"))
        elif net.num_addresses - 3 < len(c.hosts):
            problems.append(("addressing.management",
                             f"{mgmt} is too small for {len(c.hosts)} hosts"))
    return problems


# --- loading -------------------------------------------------------------------------------------
def parse_cluster(data: Any, source: str = "<input>") -> Cluster:
    """Validate plain data (as loaded from YAML) into a Cluster, or raise ClusterError."""
    if not isinstance(data, dict):
        raise ClusterError([("", f"{source}: expected a mapping with apiVersion: {API_VERSION}, "
                                 f"kind: {KIND}, got {type(data).__name__}")])
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise ClusterError(_cluster_problems(e)) from None


def _cluster_problems(err: ValidationError) -> list[tuple[str, str]]:
    """The agent's error paths, minus pydantic's discriminator tag (`fabric.direct.links`)."""
    out = []
    for path, msg in _problems(err, ""):
        for tag in ("direct", "switched"):
            if path == f"fabric.{tag}" or path.startswith(f"fabric.{tag}."):
                path = "fabric" + path[len(f"fabric.{tag}"):]
        out.append((path, msg))
    return out


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate a cluster file; ClusterError (one line per problem) when it is bad."""
    try:
        data = load_yaml_file(path)
    except StateError as e:
        raise ClusterError(e.problems) from None
    return parse_cluster(data, str(path))
