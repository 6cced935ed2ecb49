"""The kernel driver: every operation as one pyroute2 netlink request (plus /proc/sys writes).

Idempotent verbs where the kernel has them (route replace, class replace); the diff never asks
for an add of something already present. Rates go to the kernel in bytes/s, weights as hops."""

from __future__ import annotations

import ipaddress
import socket

from pyroute2 import IPRoute

from topoagent.observe.host import U32_PRIO
from topoagent.state.host import TC_MAJOR, QosClass, Route, Rule, htb_credit
from topoagent.target import Target

ETH_P_IP = 0x0800
SCOPE_UNIVERSE, SCOPE_LINK, SCOPE_NOWHERE = 0, 253, 255
U32_HT = 0x800  # the default hash table every u32 filter of a prio lands in


def u32_handle(minor: int) -> int:
    """Filter handle 800::<minor>: one filter per class, so deleting one needs no lookup."""
    return (U32_HT << 20) | minor


class NetlinkDriver:
    """The kernel driver: each operation as pyroute2 netlink requests (and /proc/sys writes) in the
    target."""

    def __init__(self, target: Target, ipr: IPRoute):
        self.target = target
        self.ipr = ipr
        self._index: dict[str, int] = {}
        self._mtu: dict[str, int] = {}  # read once per device (set_link keeps it current)

    def index(self, dev: str) -> int:
        """The ifindex of `dev` (cached); LookupError when there is no such link."""
        if dev not in self._index:
            found = self.ipr.link_lookup(ifname=dev)
            if not found:
                raise LookupError(f"no such link: {dev}")
            self._index[dev] = found[0]
        return self._index[dev]

    # --- sysctl and links -------------------------------------------------------------------------
    def set_sysctl(self, path: str, value: str) -> None:
        """Write a /proc/sys value in the target."""
        self.target.write_sysctl(path, value)

    def set_link(self, dev: str, mtu: int | None, up: bool | None) -> None:
        """Set a link's MTU and/or state."""
        kw: dict = {}
        if mtu is not None:
            kw["mtu"] = mtu
        if up is not None:
            kw["state"] = "up" if up else "down"
        self.ipr.link("set", index=self.index(dev), **kw)
        if mtu is not None:
            self._mtu[dev] = mtu

    # --- addresses --------------------------------------------------------------------------------
    def add_address(self, dev: str, address: str, proto: int) -> None:
        """Add an address with protocol mark `proto`."""
        iface = ipaddress.IPv4Interface(address)
        self.ipr.addr("add", index=self.index(dev), address=str(iface.ip),
                      prefixlen=iface.network.prefixlen, proto=proto)

    def del_address(self, dev: str, address: str) -> None:
        """Without promote_secondaries the kernel deletes every secondary address of the subnet
        along with a primary one (and the routes through them): an apply that moves a host from
        .1/24 to .5/24 would lose .5. Promote for the duration of the delete, then restore."""
        iface = ipaddress.IPv4Interface(address)
        knob = f"net/ipv4/conf/{dev}/promote_secondaries"
        old = self.target.read_sysctl(knob)
        if old == "0":
            self.target.write_sysctl(knob, "1")
        try:
            self.ipr.addr("del", index=self.index(dev), address=str(iface.ip),
                          prefixlen=iface.network.prefixlen)
        finally:
            if old == "0":
                self.target.write_sysctl(knob, old)

    # --- routes -----------------------------------------------------------------------------------
    def _route_args(self, route: Route) -> dict:
        kw: dict = dict(dst=route.dst, table=route.table, priority=route.metric,
                        family=socket.AF_INET)
        if route.nexthops:
            kw["multipath"] = [
                {**({"gateway": h.via} if h.via else {}),
                 **({"oif": self.index(h.dev)} if h.dev else {}),
                 "hops": h.weight - 1}  # the kernel stores weight - 1
                for h in route.nexthops
            ]
            kw["scope"] = SCOPE_UNIVERSE
        else:
            if route.via:
                kw["gateway"] = route.via
            if route.dev:
                kw["oif"] = self.index(route.dev)
            kw["scope"] = SCOPE_UNIVERSE if route.via else SCOPE_LINK
        if route.src:
            kw["prefsrc"] = route.src
        return kw

    def set_route(self, route: Route, proto: int) -> None:
        """Create or replace a route with protocol `proto`."""
        self.ipr.route("replace", proto=proto, **self._route_args(route))

    def del_route(self, route: Route, proto: int) -> None:
        """Delete a route."""
        # scope NOWHERE is the kernel's wildcard (as `ip route del` sends); the key and the
        # protocol select the route
        self.ipr.route("del", dst=route.dst, table=route.table, priority=route.metric,
                       family=socket.AF_INET, proto=proto, scope=SCOPE_NOWHERE)

    # --- rules ------------------------------------------------------------------------------------
    def _rule_args(self, rule: Rule, proto: int) -> dict:
        kw: dict = dict(family=socket.AF_INET, priority=rule.priority, table=rule.table,
                        action="to_tbl", protocol=proto)
        for key, net in (("src", rule.from_), ("dst", rule.to)):
            if net:
                n = ipaddress.IPv4Network(net)
                kw[key], kw[f"{key}_len"] = str(n.network_address), n.prefixlen
        if rule.fwmark is not None:
            kw["fwmark"] = rule.fwmark
        if rule.iif:
            kw["iifname"] = rule.iif
        if rule.oif:
            kw["oifname"] = rule.oif
        return kw

    def add_rule(self, rule: Rule, proto: int) -> None:
        """Add a policy rule with protocol `proto`."""
        self.ipr.rule("add", **self._rule_args(rule, proto))

    def del_rule(self, rule: Rule, proto: int) -> None:
        """Delete a policy rule."""
        self.ipr.rule("del", **self._rule_args(rule, proto))

    # --- per-destination QoS: HTB + u32 ------------------------------------------------------
    def add_qdisc(self, dev: str, rate: int) -> None:
        """Add the agent's HTB root qdisc and root class at `rate`."""
        idx = self.index(dev)
        # default 0: unclassified traffic bypasses the classes (not throttled by the plan)
        self.ipr.tc("add", "htb", index=idx, handle=TC_MAJOR << 16, default=0)
        self.ipr.tc("add-class", "htb", index=idx, handle=(TC_MAJOR << 16) | 1,
                    parent=TC_MAJOR << 16, **self._htb_rates(dev, rate, rate))

    def set_root_rate(self, dev: str, rate: int) -> None:
        """Change the rate of the agent's HTB root class."""
        self.ipr.tc("replace-class", "htb", index=self.index(dev), handle=(TC_MAJOR << 16) | 1,
                    parent=TC_MAJOR << 16, **self._htb_rates(dev, rate, rate))

    def _htb_rates(self, dev: str, rate: int, ceil: int) -> dict[str, int]:
        """pyroute2 HTB class arguments for `rate`/`ceil` bit/s: bytes/s, and the agent's token
        credit at each (`topoagent.state.host.htb_credit`, bytes)."""
        if dev not in self._mtu:  # one request per device, not per class (256 classes: 0.8 s)
            link = self.ipr.link("get", index=self.index(dev))[0]
            self._mtu[dev] = link.get_attr("IFLA_MTU") or 1500
        mtu = self._mtu[dev]
        return {"rate": rate // 8, "ceil": ceil // 8, "burst": htb_credit(rate, mtu),
                "cburst": htb_credit(ceil, mtu)}

    def del_qdisc(self, dev: str) -> None:
        """Delete the agent's root qdisc (its classes and filters with it)."""
        self.ipr.tc("del", index=self.index(dev), handle=TC_MAJOR << 16, parent=0xFFFFFFFF)

    def set_class(self, dev: str, cls: QosClass) -> None:
        """Create or replace an HTB class."""
        self.ipr.tc("replace-class", "htb", index=self.index(dev),
                    handle=(TC_MAJOR << 16) | cls.id, parent=(TC_MAJOR << 16) | 1,
                    **self._htb_rates(dev, cls.rate, cls.ceil or cls.rate))

    def del_class(self, dev: str, minor: int) -> None:
        """Delete an HTB class."""
        self.ipr.tc("del-class", index=self.index(dev), handle=(TC_MAJOR << 16) | minor,
                    parent=(TC_MAJOR << 16) | 1)

    def add_filter(self, dev: str, minor: int, dst: str) -> None:
        """Add the u32 filter sending packets for `dst` to class `minor`."""
        net = ipaddress.IPv4Network(dst)
        key = f"0x{int(net.network_address):08x}/0x{int(net.netmask):08x}+16"
        self.ipr.tc("add-filter", "u32", index=self.index(dev), parent=TC_MAJOR << 16,
                    prio=U32_PRIO, protocol=ETH_P_IP, handle=u32_handle(minor),
                    target=(TC_MAJOR << 16) | minor, keys=[key])

    def del_filter(self, dev: str, minor: int) -> None:
        """Delete the u32 filter of class `minor`."""
        self.ipr.tc("del-filter", "u32", index=self.index(dev), parent=TC_MAJOR << 16,
                    prio=U32_PRIO, protocol=ETH_P_IP, handle=u32_handle(minor),
                    target=(TC_MAJOR << 16) | minor, keys=[])  # pyroute2 insists on both
