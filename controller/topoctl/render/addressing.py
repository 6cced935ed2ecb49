"""Addresses for a fabric: one subnet per cable (direct fabrics: a /30, ends .1 and .2) or per
switched L2 domain (switches joined by uplinks form one domain), carved in order from the
fabric pool (README: 10.234.0.0/15); one training /32 per host from the training pool
(10.236.0.0/16), held on `lo` and routed over the fabric. IPv6 (`addressing.family` ipv6 or
dual) the same way from the IPv6 pools (default: the project's unique local range
fd74:6f70:6f63::/48, "topoc" in ASCII): a /64 per cable (ends ::1 and ::2) or domain, one
/128 per host. Deterministic: the same cluster gives the same addresses. O(ports + cables)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from topoagent.protocol import TopoError
from topoctl.fabric.graph import FabricGraph


class AddressingError(TopoError, ValueError):
    """The cluster's address pools cannot number the fabric; `path` names the YAML path."""

    def __init__(self, path: str, message: str):
        super().__init__(message, path)


@dataclass
class Addressing:
    """The addresses of a plan in one family: training /32 (/128) per host, each port's address,
    and the subnet of each cable or L2 domain. The family training runs over; `other`: a dual
    plan's IPv4 addresses beside its IPv6 ones."""

    training: dict[str, str]  # host -> a.b.c.d (a /32 on lo)
    port: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, nic) -> a.b.c.d/len
    subnets: dict[str, str] = field(default_factory=dict)  # cable "h0:eth0-h1:eth1" / domain
    domain_of: dict[tuple[str, str], str] = field(default_factory=dict)  # switched (host, nic)
    version: int = 4  # 4 or 6
    other: Addressing | None = None  # dual: the IPv4 addressing beside this IPv6 one

    def ip(self, host: str, nic: str) -> str:
        """The address (without prefix length) of `host`'s port `nic`."""
        return self.port[(host, nic)].split("/")[0]

    @property
    def host_len(self) -> int:
        """The prefix length of one address: 32 or 128."""
        return 32 if self.version == 4 else 128

    def host_net(self, host: str) -> str:
        """`host`'s training address as a one-address network (a.b.c.d/32, x::y/128)."""
        return f"{self.training[host]}/{self.host_len}"

    @property
    def forward_sysctl(self) -> str:
        """The HostState sysctl that turns forwarding of this family on."""
        return "ip_forward" if self.version == 4 else "ipv6_forwarding"

    @property
    def hash_sysctl(self) -> str:
        """The HostState sysctl for this family's multipath hash policy."""
        return "multipath_hash_policy" if self.version == 4 else "ipv6_multipath_hash_policy"

    def families(self) -> list[Addressing]:
        """This addressing, then the other family's (dual plans)."""
        return [self] if self.other is None else [self, self.other]

    def summary(self) -> dict:
        """`metadata.addressing`: training addresses and subnets (IPv4 plans: exactly those;
        IPv6 and dual plans name their family, dual ones add the IPv4 addresses)."""
        out: dict = {"training": self.training, "subnets": self.subnets}
        if self.version == 4:
            return out
        fam = "ipv6" if self.other is None else "dual"
        return {"family": fam} | out | ({"ipv4": self.other.summary()} if self.other else {})


def _domains(graph: FabricGraph) -> dict[str, str]:
    """switch -> the name of its L2 domain (the lexically first switch in its component)."""
    parent = {s: s for s in graph.switches}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for ln in graph.links:
        if ln.kind == "uplink":
            a, b = find(ln.a), find(ln.b)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {s: find(s) for s in graph.switches}


def assign_cluster(graph: FabricGraph, pools) -> Addressing:
    """Addresses for `graph` in the family the cluster's `addressing` section (`pools`: its
    family, fabric, training, fabric6 and training6) asks for; dual: the IPv6 addressing (the
    one training runs over) with the IPv4 one as its `other`."""
    family = getattr(pools, "family", "ipv4")
    if family == "ipv4":
        return assign(graph, pools.fabric, pools.training)
    v6 = assign(graph, pools.fabric6, pools.training6, names=("fabric6", "training6"))
    if family == "dual":
        v6.other = assign(graph, pools.fabric, pools.training)
    return v6


def assign(graph: FabricGraph, fabric_pool: str = "10.234.0.0/15",
           training_pool: str = "10.236.0.0/16",
           names: tuple[str, str] = ("fabric", "training")) -> Addressing:
    """Addresses for every host and port of `graph` from the two pools (both IPv4 or both
    IPv6; `names`: their keys under `addressing`, for errors); AddressingError when a pool is
    too small."""
    tpool = ipaddress.ip_network(training_pool)
    v6 = tpool.version == 6
    if tpool.num_addresses - (1 if v6 else 2) < len(graph.hosts):
        raise AddressingError(f"addressing.{names[1]}",
                              f"{training_pool} is too small for {len(graph.hosts)} hosts")
    make = ipaddress.IPv6Address if v6 else ipaddress.IPv4Address
    base = int(tpool.network_address) + 1
    training = {h: str(make(base + i)) for i, h in enumerate(graph.hosts)}
    pool = ipaddress.ip_network(fabric_pool)
    bits = pool.max_prefixlen
    nxt = int(pool.network_address)
    end = int(pool.broadcast_address) + 1
    out = Addressing(training, version=pool.version)

    def carve(prefix: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        nonlocal nxt
        size = 2 ** (bits - prefix)
        nxt = (nxt + size - 1) // size * size  # align
        if nxt + size > end:
            raise AddressingError(f"addressing.{names[0]}", f"{fabric_pool} is too small for "
                                                            "this fabric's subnets")
        net = ipaddress.ip_network((make(nxt), prefix))
        nxt += size
        return net

    if graph.kind == "direct":
        plen = 64 if v6 else 30  # IPv6: a /64 per link (RFC 5375), ends ::1 and ::2
        for ln in graph.links:
            net = carve(plen)
            a = int(net.network_address)
            out.port[(ln.a, ln.a_nic)] = f"{make(a + 1)}/{plen}"
            out.port[(ln.b, ln.b_nic)] = f"{make(a + 2)}/{plen}"
            out.subnets[f"{ln.a}:{ln.a_nic}-{ln.b}:{ln.b_nic}"] = str(net)
        return out
    dom = _domains(graph)
    members: dict[str, list[tuple[str, str]]] = {}
    for ln in graph.links:
        if ln.kind == "access":
            members.setdefault(dom[ln.b], []).append((ln.a, ln.a_nic))
    for d in sorted(members, key=list(graph.switches).index):
        ports = members[d]
        prefix = 64 if v6 else 32 - max(2, (len(ports) + 1).bit_length())
        net = carve(prefix)
        a = int(net.network_address)
        for i, (h, nic) in enumerate(ports):
            out.port[(h, nic)] = f"{make(a + 1 + i)}/{prefix}"
            out.domain_of[(h, nic)] = d
        out.subnets[d] = str(net)
    return out
