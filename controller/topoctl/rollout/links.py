"""Which cables carry a plan's training, and which cable an interface that lost its carrier
belongs to (pure functions over plan data; `topoctl run` and `run --heal` use them).

A host's interfaces that carry training are the ones its routes leave through (`dev`, or the
interface whose subnet holds `via`): forwarding hosts included, since every host has a route to
every other host's training address. A host behind Open vSwitch routes through the internal
port, so all its cabled NICs count. Cables are named as the lab and the cluster file name them:
`h3:eth0--h4:eth1` (direct), `h0:eth0--s0` (a NIC attached to switch s0)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True)
class Cable:
    """One cable: `a` is HOST:NIC, `b` HOST:NIC (direct) or a switch name."""

    a: str
    b: str

    @property
    def name(self) -> str:
        """The cable as `topoctl lab` names it: A--B."""
        return f"{self.a}--{self.b}"

    def peer(self, port: str) -> str:
        """The other end of the cable from `port` (HOST:NIC)."""
        return self.b if port == self.a else self.a


def fabric_ports(fabric: dict, host: str, nics: list[str]) -> list[str]:
    """`host`'s NICs that the fabric cables (`nics`: the host's NICs, for switched fabrics whose
    attachments name a bare host or nothing)."""
    return [n for n in nics if cable_at(fabric, host, n) is not None]


def cable_at(fabric: dict, host: str, nic: str) -> Cable | None:
    """The cable plugged into HOST:NIC in a plan's (or cluster file's) `fabric`; None when the
    port is not cabled."""
    port = f"{host}:{nic}"
    if fabric.get("kind") == "direct":
        for link in fabric.get("links") or []:
            if port in (link.get("a"), link.get("b")):
                return Cable(link["a"], link["b"])
        return None
    switches = fabric.get("switches") or []
    attach = fabric.get("attach") or []
    if not attach and len(switches) == 1:  # a star: every NIC on the one switch
        return Cable(port, switches[0]["name"])
    for at in attach:
        if at.get("port") in (port, host):
            return Cable(port, at["switch"])
    return None


def route_devices(state: dict) -> set[str]:
    """The interfaces a HostState's routes leave through (`via` resolved to the interface whose
    address subnet holds it)."""
    nets = [(i["name"], ipaddress.ip_interface(a).network)
            for i in state.get("interfaces") or [] for a in i.get("addresses") or []]

    def dev_of(hop: dict) -> str | None:
        if hop.get("dev"):
            return hop["dev"]
        via = hop.get("via")
        if via:
            ip = ipaddress.ip_address(via)
            for name, net in nets:  # a different family's network holds no address
                if ip in net and net.prefixlen < net.max_prefixlen:
                    return name
        return None

    devs = set()
    for r in state.get("routes") or []:
        for hop in r.get("nexthops") or [r]:
            d = dev_of(hop)
            if d:
                devs.add(d)
    return devs


def watched_interfaces(plan: dict) -> dict[str, list[str]]:
    """Per host of the plan's job, the cabled interfaces its routes use (all cabled NICs for a
    host behind Open vSwitch): what the launcher watches."""
    fabric = plan.get("fabric") or {}
    out = {}
    for host in sorted((plan.get("job") or {}).get("processes") or {}):
        state = plan["hosts"].get(host) or {}
        nics = [i["name"] for i in state.get("interfaces") or [] if i["name"] != "lo"]
        cabled = fabric_ports(fabric, host, nics + sorted(_ovs_ports(state)))
        devs = route_devices(state)
        if devs - set(cabled) - {"lo"}:  # routes through something else (OVS's internal port)
            out[host] = sorted(set(cabled))
        else:
            out[host] = sorted(devs & set(cabled))
    return out


def _ovs_ports(state: dict) -> set[str]:
    """The NICs a host behind Open vSwitch has on its bridge (they carry no addresses)."""
    ovs = state.get("ovs") or {}
    return {p["name"] if isinstance(p, dict) else p
            for b in ovs.get("bridges") or [] for p in b.get("ports") or []}
