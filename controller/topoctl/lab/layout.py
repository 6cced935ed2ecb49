"""What a lab consists of, computed from a cluster without touching the machine.

Model: every host is a namespace whose fabric ports are veths; the other end of each port (`eN`)
sits in the lab's one wire namespace, which is the patch panel. A direct cable between ports i
and j is two tc mirred redirects (ingress of eI -> egress of eJ and back) plus an HTB rate on the
egress of both ends, so each direction is shaped where the hosts cannot see it and their own
qdiscs stay free for the agent. Because host ports never move, re-cabling a job's topology only
rewrites tc state in the wire namespace. An unplugged port's end is down (the host sees no
carrier), which is also how `cut` works.

A switch is a Linux bridge in the wire namespace. A port attaches through a veth pair aN/bN: eN's
ingress is redirected to aN (shaped host->switch), bN is a bridge port, and what the bridge sends
out of bN arrives at aN and is redirected to eN (shaped switch->host). A leaf's uplink is a veth
pair uK/vK between leaf and spine bridges, shaped on both egresses.

One wire namespace per lab (not one per cable) keeps `up`/`down` of a 32-host lab well inside
its time budget and lets one `tc -n` call show every cable.
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field

from topoctl.lab import names
from topoctl.spec.cluster import Cluster, parse_port_ref
from topoctl.spec.cluster_parts import LAB_MANAGEMENT6


@dataclass
class HostPort:
    """A host's fabric port in the lab: the host-side veth and its wire-namespace end."""

    ref: str  # host:nic
    host: str
    nic: str
    index: int  # position among all ports: names the wire end
    end: str  # wire-namespace end
    mac: str
    speed: int


@dataclass
class Cable:
    """A direct cable: a_end <-> b_end in the wire namespace, `rate` bit/s each direction."""

    a: str  # host:nic
    b: str
    a_end: str
    b_end: str
    rate: int
    latency: float = 0.0
    loss: float = 0.0

    @property
    def name(self) -> str:
        """The cable as `a--b`."""
        return f"{self.a}--{self.b}"


@dataclass
class SwitchPort:
    """A host port attached to a switch bridge through the shaped veth pair (shaped, bport)."""

    ref: str
    end: str
    shaped: str
    bport: str
    switch: str  # switch name
    bridge: str
    rate: int
    latency: float = 0.0
    loss: float = 0.0


@dataclass
class Uplink:
    """A shaped leaf-to-spine link between two switch bridges."""

    leaf: str
    spine: str
    leaf_end: str  # port of the leaf bridge
    spine_end: str  # port of the spine bridge
    rate: int
    latency: float = 0.0


@dataclass
class LabHost:
    """One lab host: its namespace, management address and fabric ports."""

    name: str
    ns: str
    mgmt_ip: str  # a.b.c.d (prefix length: Layout.mgmt_net)
    mgmt_root_if: str
    ports: list[HostPort]


@dataclass
class Layout:
    """Everything a lab consists of (namespaces, ports, cables, switches, management network),
    computed from a cluster."""

    lab: str
    kind: str  # direct | switched
    mtu: int
    mgmt_net: str
    gateway: str  # the root bridge's address
    wire_ns: str
    hosts: list[LabHost]
    cables: list[Cable] = field(default_factory=list)
    switch_ports: list[SwitchPort] = field(default_factory=list)
    bridges: dict[str, str] = field(default_factory=dict)  # switch name -> bridge in wire ns
    uplinks: list[Uplink] = field(default_factory=list)
    # an IPv6-only cluster's lab: management in IPv6 too (`mgmt6`), sshd reached over it
    mgmt_ipv6: bool = False

    def to_dict(self) -> dict:
        """The layout as plain data (`from_dict` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        """The layout `to_dict` wrote."""
        d = dict(d)
        d["hosts"] = [LabHost(**{**h, "ports": [HostPort(**p) for p in h["ports"]]})
                      for h in d["hosts"]]
        d["cables"] = [Cable(**c) for c in d.get("cables", [])]
        d["switch_ports"] = [SwitchPort(**s) for s in d.get("switch_ports", [])]
        d["uplinks"] = [Uplink(**u) for u in d.get("uplinks", [])]
        return cls(**d)

    def host(self, name: str) -> LabHost:
        """The lab host named `name` (KeyError when absent)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name} in lab {self.lab}")

    def ports(self) -> dict[str, HostPort]:
        """`host:nic` -> port, over every host."""
        return {p.ref: p for h in self.hosts for p in h.ports}

    def prefixlen(self) -> int:
        """Prefix length of the management network."""
        return ipaddress.IPv4Network(self.mgmt_net).prefixlen

    def prefixlen6(self) -> int:
        """Prefix length of the IPv6 management network (`mgmt6` of the IPv4 one)."""
        return 96 + self.prefixlen()

    def ssh_ip(self, host: str) -> str:
        """The address the controller reaches `host`'s sshd at: its IPv6 management address
        in an IPv6-only lab, else the IPv4 one."""
        ip = self.host(host).mgmt_ip
        return mgmt6(ip) if self.mgmt_ipv6 else ip


def mgmt6(ipv4: str) -> str:
    """An IPv6-only lab's management address for IPv4 management address `ipv4`: the IPv4
    address in the low 32 bits of LAB_MANAGEMENT6 (unique because the IPv4 blocks are)."""
    base = ipaddress.IPv6Network(LAB_MANAGEMENT6).network_address
    return str(ipaddress.IPv6Address(int(base) + int(ipaddress.IPv4Address(ipv4))))


def mgmt_block_size(hosts: int) -> int:
    """Prefix length of the smallest block (at most /24) holding the gateway and every host."""
    plen = 24
    while 2 ** (32 - plen) - 3 < hosts:
        plen -= 1
    return plen


def build_layout(cluster: Cluster, lab: str, mgmt_net: str) -> Layout:
    """The layout of lab `lab` for `cluster` with management addresses from `mgmt_net`; ValueError
    when it does not fit."""
    names.check_lab_name(lab)
    net = ipaddress.IPv4Network(mgmt_net)
    if net.num_addresses - 3 < len(cluster.hosts):
        raise ValueError(f"management network {mgmt_net} is too small for "
                         f"{len(cluster.hosts)} hosts")
    g = cluster.graph()
    addrs = list(net.hosts())
    ports_by_ref: dict[str, HostPort] = {}
    hosts = []
    idx = 0
    for i, h in enumerate(cluster.hosts):
        hp = []
        for n in h.nics:
            ref = f"{h.name}:{n.name}"
            p = HostPort(ref, h.name, n.name, idx, names.wire_end(idx),
                         n.mac or names.port_mac(lab, h.name, n.name),
                         cluster.nic_speed(h.name, n.name))
            ports_by_ref[ref] = p
            hp.append(p)
            idx += 1
        hosts.append(LabHost(h.name, names.host_ns(lab, h.name), str(addrs[i + 1]),
                             names.mgmt_root_if(lab, i), hp))
    layout = Layout(lab, g.kind, g.mtu, str(net), str(addrs[0]), names.wire_ns(lab), hosts,
                    mgmt_ipv6=cluster.addressing.family == "ipv6")
    if g.kind == "direct":
        layout.cables = cables_of(cluster, ports_by_ref)
        return layout
    for k, s in enumerate(g.switches):
        layout.bridges[s] = names.switch_bridge(k)
    k = 0
    for ln in g.links:
        if ln.kind == "access":
            p = ports_by_ref[f"{ln.a}:{ln.a_nic}"]
            shaped, bport = names.switch_port(p.index)
            layout.switch_ports.append(SwitchPort(p.ref, p.end, shaped, bport, ln.b,
                                                  layout.bridges[ln.b], ln.capacity, ln.latency,
                                                  ln.loss))
        elif ln.kind == "uplink":
            le, se = names.uplink(k)
            layout.uplinks.append(Uplink(ln.a, ln.b, le, se, ln.capacity, ln.latency))
            k += 1
    return layout


def cables_of(cluster: Cluster, ports: dict[str, HostPort]) -> list[Cable]:
    """The direct cables of `cluster` (possibly re-cabled by a plan) on these ports."""
    out = []
    for ln in cluster.graph().links:
        a, b = ports[f"{ln.a}:{ln.a_nic}"], ports[f"{ln.b}:{ln.b_nic}"]
        out.append(Cable(a.ref, b.ref, a.end, b.end, ln.capacity, ln.latency, ln.loss))
    return out


def find_cable(layout: Layout, spec: str) -> list[tuple[str, list[str]]]:
    """`HOST:PORT` -> [(cable or switch-port name, wire ends to set up/down)]."""
    parse_port_ref(spec)
    for c in layout.cables:
        if spec in (c.a, c.b):
            return [(c.name, [c.a_end, c.b_end])]
    for s in layout.switch_ports:
        if s.ref == spec:
            return [(f"{s.ref}--{s.switch}", [s.end])]
    if spec in layout.ports():
        raise ValueError(f"{spec} is not cabled")
    raise ValueError(f"no port {spec} in lab {layout.lab}")
