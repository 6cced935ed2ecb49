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

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError
from pydantic import model_validator as _model_validator

from topoagent.protocol import API_VERSION
from topoagent.state.schema import Model, validation_problems
from topoagent.state.values import Rate
from topoctl.fabric.graph import FabricGraph, FabricLink, Port
from topoctl.spec.cluster_checks import check_cluster
from topoctl.spec.cluster_parts import (
    DEFAULT_FABRIC_SUBNETS,
    DEFAULT_TRAINING_SUBNET,
    LAB_MANAGEMENT,
    OVSDB_REMOTE,
    Addressing,
    Attach,
    ClusterError,
    Defaults,
    DeviceLink,
    DirectFabric,
    Duration,
    Gpus,
    GpuType,
    Host,
    Inventory,
    Link,
    Loss,
    Name,
    Nic,
    NicName,
    OvsdbRemote,
    PortRef,
    Switch,
    SwitchedFabric,
    format_duration,
    parse_duration,
    parse_loss,
    parse_port_ref,
)
from topoctl.spec.interconnect import LinkSpec, resolve_link

# the pieces of the file live in `spec.cluster_parts`; importers find them here too
__all__ = [
    "API_VERSION", "DEFAULT_FABRIC_SUBNETS", "DEFAULT_TRAINING_SUBNET", "KIND", "LAB_MANAGEMENT",
    "OVSDB_REMOTE", "Addressing", "Attach", "Cluster", "ClusterError", "Defaults", "DeviceLink",
    "DirectFabric", "Duration", "GpuType", "Gpus", "Host", "Inventory", "Link", "Loss", "Name",
    "Nic", "NicName",
    "OvsdbRemote", "PortRef", "Switch", "SwitchedFabric", "cluster_problems", "fabric_graph",
    "format_duration", "parse_duration", "parse_loss", "parse_port_ref",
]

KIND = "Cluster"


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

    def device_link(self, host: str) -> LinkSpec:
        """The interconnect among `host`'s devices (bytes/s per device per direction, latency):
        its `gpus.link`, filled in from the device type's datasheet figures
        (`topoctl.spec.interconnect`)."""
        g = self.gpus(host)
        ln = g.link or DeviceLink()
        return resolve_link(g.type, ln.kind, ln.bandwidth, ln.latency)

    def rails(self, host: str) -> list[str] | None:
        """With `gpus.nics: rails`, the NIC of each of `host`'s devices (device i: NIC i);
        None when the devices share the host's NICs."""
        g = self.gpus(host)
        if g.nics != "rails":
            return None
        return [n.name for n in self.host(host).nics[:g.count]]

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


def cluster_problems(err: ValidationError) -> list[tuple[str, str]]:
    """The agent's error paths, minus pydantic's discriminator tag (`fabric.direct.links`)."""
    out = []
    for path, msg in validation_problems(err, ""):
        for tag in ("direct", "switched"):
            if path == f"fabric.{tag}" or path.startswith(f"fabric.{tag}."):
                path = "fabric" + path[len(f"fabric.{tag}"):]
        out.append((path, msg))
    return out


def fabric_graph(c: Cluster) -> FabricGraph:
    """The cluster's fabric as plain data: ports with their speeds, links with capacity, latency
    and loss (defaults filled in); switched fabrics with their uplinks' capacities resolved."""
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
    for ref, at in c.attachments():
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
    """`v`, or `default` when `v` is None."""
    return default if v is None else v
