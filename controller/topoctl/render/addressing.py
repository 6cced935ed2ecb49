"""Addresses for a fabric: one subnet per cable (direct fabrics: a /30, ends .1 and .2) or per
switched L2 domain (switches joined by uplinks form one domain), carved in order from the
fabric pool (README: 10.234.0.0/15); one training /32 per host from the training pool
(10.236.0.0/16), held on `lo` and routed over the fabric. Deterministic: the same cluster gives
the same addresses. O(ports + cables)."""

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
    """The addresses of a plan: training /32 per host, each port's address, and the subnet of each
    cable or L2 domain."""

    training: dict[str, str]  # host -> a.b.c.d (a /32 on lo)
    port: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, nic) -> a.b.c.d/len
    subnets: dict[str, str] = field(default_factory=dict)  # cable "h0:eth0-h1:eth1" / domain
    domain_of: dict[tuple[str, str], str] = field(default_factory=dict)  # switched (host, nic)

    def ip(self, host: str, nic: str) -> str:
        """The address (without prefix length) of `host`'s port `nic`."""
        return self.port[(host, nic)].split("/")[0]


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


def assign(graph: FabricGraph, fabric_pool: str = "10.234.0.0/15",
           training_pool: str = "10.236.0.0/16") -> Addressing:
    """Addresses for every host and port of `graph` from the two pools; AddressingError when a pool
    is too small."""
    tpool = ipaddress.IPv4Network(training_pool)
    if tpool.num_addresses - 2 < len(graph.hosts):
        raise AddressingError("addressing.training",
                              f"{training_pool} is too small for {len(graph.hosts)} hosts")
    base = int(tpool.network_address) + 1
    training = {h: str(ipaddress.IPv4Address(base + i)) for i, h in enumerate(graph.hosts)}
    pool = ipaddress.IPv4Network(fabric_pool)
    nxt = int(pool.network_address)
    end = int(pool.broadcast_address) + 1
    out = Addressing(training)

    def carve(prefix: int) -> ipaddress.IPv4Network:
        nonlocal nxt
        size = 2 ** (32 - prefix)
        nxt = (nxt + size - 1) // size * size  # align
        if nxt + size > end:
            raise AddressingError("addressing.fabric", f"{fabric_pool} is too small for this "
                                                       "fabric's subnets")
        net = ipaddress.IPv4Network((nxt, prefix))
        nxt += size
        return net

    if graph.kind == "direct":
        for ln in graph.links:
            net = carve(30)
            a = int(net.network_address)
            out.port[(ln.a, ln.a_nic)] = f"{ipaddress.IPv4Address(a + 1)}/30"
            out.port[(ln.b, ln.b_nic)] = f"{ipaddress.IPv4Address(a + 2)}/30"
            out.subnets[f"{ln.a}:{ln.a_nic}-{ln.b}:{ln.b_nic}"] = str(net)
        return out
    dom = _domains(graph)
    members: dict[str, list[tuple[str, str]]] = {}
    for ln in graph.links:
        if ln.kind == "access":
            members.setdefault(dom[ln.b], []).append((ln.a, ln.a_nic))
    for d in sorted(members, key=list(graph.switches).index):
        ports = members[d]
        prefix = 32 - max(2, (len(ports) + 1).bit_length())
        net = carve(prefix)
        a = int(net.network_address)
        for i, (h, nic) in enumerate(ports):
            out.port[(h, nic)] = f"{ipaddress.IPv4Address(a + 1 + i)}/{prefix}"
            out.domain_of[(h, nic)] = d
        out.subnets[d] = str(net)
    return out
