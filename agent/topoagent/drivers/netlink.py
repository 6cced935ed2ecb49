"""The kernel driver: each operation as rtnetlink requests (`topoagent.drivers.nlwrite`, many
per send), sysctls as /proc/sys writes. pyroute2 (0.15 s to import) only for `ipr`, opened on
first use by the callers that ask the kernel a question (`ip route get` of the management
guard).

Idempotent verbs where the kernel has them (route replace, class replace); the diff never asks
for an add of something already present. Rates go to the kernel in bytes/s, weights as hops.
Operations that are requests (`Op.requests`) are sent in batches by `topoagent.apply.batch`;
the single-operation methods here send one batch of their own."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from typing import Any

from topoagent.drivers import nlwrite
from topoagent.drivers.nlwrite import ADD, REPLACE, Ack, Request
from topoagent.observe import nldump, uapi
from topoagent.observe.host import (
    ETH_P_IP,
    ETH_P_IPV6,
    IPV4_DST_OFFSET,
    IPV6_DST_OFFSET,
    U32_PRIO,
    U32_PRIO6,
)
from topoagent.state.host import TC_MAJOR, QosClass, Route, Rule, htb_credit
from topoagent.target import Target

U32_HT = 0x800  # the default hash table every u32 filter of a prio lands in
ROOT, ROOT_CLASS = TC_MAJOR << 16, (TC_MAJOR << 16) | 1


class KernelError(OSError):
    """The kernel refused a request (errno, with its extended-ack text)."""

    def __init__(self, ack: Ack):
        super().__init__(ack.error, ack.reason())
        self.ack = ack


class NetlinkDriver:
    """The kernel driver: rtnetlink requests (and /proc/sys writes) in the target."""

    def __init__(self, target: Target, ipr: Any = None, channel: nlwrite.Channel | None = None):
        self.target = target
        self._ipr = ipr
        self._own_ipr = False
        self._channel = channel
        self._index: dict[str, int] = {}
        self._mtu: dict[str, int] = {}  # read with the links (set_link keeps it current)
        self._u32_tables: dict[str, dict[int, list[int]]] = {}  # dev -> {prio: [htid, n]}

    @property
    def ipr(self) -> Any:
        """A pyroute2 IPRoute in the target (opened, and pyroute2 imported, on first use)."""
        if self._ipr is None:
            self._ipr = self.target.iproute()
            self._own_ipr = True
        return self._ipr

    @property
    def channel(self) -> nlwrite.Channel:
        """The write socket in the target (opened on first use)."""
        if self._channel is None:
            self._channel = nlwrite.open_in(self.target.inside)
        return self._channel

    def close(self) -> None:
        """Close the write socket, and `ipr` when this driver opened it."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._own_ipr and self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    def call(self, requests: list[Request], stop: bool = False) -> list[Ack]:
        """Send `requests` (many per send); one Ack per request (see nlwrite.Channel.call)."""
        try:
            acks = self.channel.call(requests, stop)
        finally:
            self._u32_tables.clear()  # u32 tables come and go with their filters
        if not all(a.ok for a in acks):
            # a refused (or possibly lost) MTU change: the MTU `link_request` assumed is not
            # the device's, and the HTB classes built next (a revert's) must be sized by the
            # one the kernel has, read again
            self._mtu.clear()
        return acks

    def run(self, requests: list[Request]) -> None:
        """Send `requests`; KernelError with the first refusal."""
        for ack in self.call(requests):
            if not ack.ok:
                raise KernelError(ack)

    def index(self, dev: str) -> int:
        """The ifindex of `dev` (cached); LookupError when there is no such link."""
        if dev not in self._index:
            self._read_links()  # again: a link an earlier operation made (an OVS port)
            if dev not in self._index:
                raise LookupError(f"no such link: {dev}")
        return self._index[dev]

    def _read_links(self) -> None:
        sock = nldump.open_in(self.target.inside)
        with contextlib.closing(sock):
            for link in nldump.dump_links(sock):
                self._index[link.name] = link.index
                self._mtu.setdefault(link.name, link.mtu or 1500)

    # --- sysctl and links -------------------------------------------------------------------------
    def set_sysctl(self, path: str, value: str) -> None:
        """Write a /proc/sys value in the target."""
        self.target.write_sysctl(path, value)

    def link_request(self, dev: str, mtu: int | None, up: bool | None) -> Request:
        """Set a link's MTU and/or state (the HTB classes built after it use the new MTU)."""
        req = nlwrite.link(self.index(dev), mtu, up)
        if mtu is not None:
            self._mtu[dev] = mtu
        return req

    def set_link(self, dev: str, mtu: int | None, up: bool | None) -> None:
        """Set a link's MTU and/or state."""
        self.run([self.link_request(dev, mtu, up)])

    # --- addresses --------------------------------------------------------------------------------
    def address_request(self, delete: bool, dev: str, address: str, proto: int = 0,
                        nodad: bool = False) -> Request:
        """Add or delete `address` (addr/len) on `dev`."""
        return nlwrite.address(delete, self.index(dev), address, proto, nodad)

    def add_address(self, dev: str, address: str, proto: int) -> None:
        """Add an address with protocol mark `proto`."""
        self.run([self.address_request(False, dev, address, proto)])

    def del_address(self, dev: str, address: str) -> None:
        """Without promote_secondaries the kernel deletes every secondary address of the subnet
        along with a primary one (and the routes through them): an apply that moves a host from
        .1/24 to .5/24 would lose .5. Promote for the duration of the delete, then restore.
        (IPv4 only: IPv6 has no primary and secondary addresses.)"""
        if ipaddress.ip_interface(address).version == 6:
            self.run([self.address_request(True, dev, address)])
            return
        knob = f"net/ipv4/conf/{dev}/promote_secondaries"
        old = self.target.read_sysctl(knob)
        if old == "0":
            self.target.write_sysctl(knob, "1")
        try:
            self.run([self.address_request(True, dev, address)])
        finally:
            if old == "0":
                self.target.write_sysctl(knob, old)

    # --- routes -----------------------------------------------------------------------------------
    def route_request(self, delete: bool, route: Route, proto: int,
                      exclusive: bool = False) -> Request:
        """Replace (create or change) or delete `route` with protocol `proto`; `exclusive`:
        create only, refused when a route holds its key."""
        hops = ([(h.via, self.index(h.dev) if h.dev else None, h.weight)
                 for h in route.nexthops] if route.nexthops else
                [(route.via, self.index(route.dev) if route.dev else None, 1)])
        return nlwrite.route(delete, route.dst, route.table, route.metric, proto,
                             [] if delete else hops, bool(route.nexthops), route.src, exclusive)

    def set_route(self, route: Route, proto: int) -> None:
        """Create or replace a route with protocol `proto`."""
        self.run([self.route_request(False, route, proto)])

    def del_route(self, route: Route, proto: int) -> None:
        """Delete a route."""
        self.run([self.route_request(True, route, proto)])

    # --- rules ------------------------------------------------------------------------------------
    def rule_request(self, delete: bool, rule: Rule, proto: int) -> Request:
        """Add or delete policy rule `rule` (protocol `proto`)."""
        family = socket.AF_INET6 if rule.family == "ipv6" else socket.AF_INET
        return nlwrite.rule(delete, family, rule.priority,
                            rule.table, proto, rule.from_, rule.to, rule.fwmark, rule.iif,
                            rule.oif)

    def add_rule(self, rule: Rule, proto: int) -> None:
        """Add a policy rule with protocol `proto`."""
        self.run([self.rule_request(False, rule, proto)])

    def del_rule(self, rule: Rule, proto: int) -> None:
        """Delete a policy rule."""
        self.run([self.rule_request(True, rule, proto)])

    # --- per-destination QoS: HTB + u32 ------------------------------------------------------
    def _htb(self, flags: int, dev: str, handle: int, parent: int, rate: int, ceil: int
             ) -> Request:
        """An HTB class request for `rate`/`ceil` bit/s: bytes/s to the kernel, with the
        agent's token credit at each (`topoagent.state.host.htb_credit`, bytes)."""
        idx = self.index(dev)
        if dev not in self._mtu:  # forgotten after a refusal: the kernel's, read again
            self._read_links()
        mtu = self._mtu.get(dev, 1500)
        return nlwrite.htb_class(flags, idx, handle, parent, rate // 8, ceil // 8,
                                 htb_credit(rate, mtu), htb_credit(ceil, mtu))

    def qdisc_requests(self, dev: str, rate: int) -> list[Request]:
        """The agent's HTB root qdisc and its root class at `rate`."""
        # default 0: unclassified traffic bypasses the classes (not throttled by the plan)
        return [nlwrite.htb_qdisc(False, self.index(dev), ROOT),
                self._htb(ADD, dev, ROOT_CLASS, ROOT, rate, rate)]

    def add_qdisc(self, dev: str, rate: int) -> None:
        """Add the agent's HTB root qdisc and root class at `rate`."""
        self.run(self.qdisc_requests(dev, rate))

    def root_rate_request(self, dev: str, rate: int) -> Request:
        """Change the rate of the agent's HTB root class."""
        return self._htb(REPLACE, dev, ROOT_CLASS, ROOT, rate, rate)

    def set_root_rate(self, dev: str, rate: int) -> None:
        """Change the rate of the agent's HTB root class."""
        self.run([self.root_rate_request(dev, rate)])

    def del_qdisc_request(self, dev: str) -> Request:
        """Delete the agent's root qdisc (its classes and filters with it)."""
        return nlwrite.htb_qdisc(True, self.index(dev), ROOT)

    def del_qdisc(self, dev: str) -> None:
        """Delete the agent's root qdisc (its classes and filters with it)."""
        self.run([self.del_qdisc_request(dev)])

    def class_request(self, dev: str, cls: QosClass) -> Request:
        """Create or replace an HTB class."""
        return self._htb(REPLACE, dev, (TC_MAJOR << 16) | cls.id, ROOT_CLASS, cls.rate,
                         cls.ceil or cls.rate)

    def set_class(self, dev: str, cls: QosClass) -> None:
        """Create or replace an HTB class."""
        self.run([self.class_request(dev, cls)])

    def del_class_request(self, dev: str, minor: int) -> Request:
        """Delete an HTB class."""
        return nlwrite.del_class(self.index(dev), (TC_MAJOR << 16) | minor, ROOT_CLASS)

    def del_class(self, dev: str, minor: int) -> None:
        """Delete an HTB class."""
        self.run([self.del_class_request(dev, minor)])

    def filter_request(self, delete: bool, dev: str, minor: int, dst: str) -> Request:
        """Add or delete the u32 filter sending packets for `dst` to class `minor`: IPv4
        destinations at preference U32_PRIO, IPv6 at U32_PRIO6 (one protocol per preference).

        Node id `minor` in the preference's own hash table: an add names no table (the kernel
        puts it in the preference's root table, 800: for the first preference made on a qdisc,
        801: for the next...), a delete names the table it is in, read from the kernel; the
        last filter of a preference is deleted with its preference."""
        six = ":" in dst
        prio, proto, offset = ((U32_PRIO6, ETH_P_IPV6, IPV6_DST_OFFSET) if six
                               else (U32_PRIO, ETH_P_IP, IPV4_DST_OFFSET))
        idx = self.index(dev)
        table = self._u32_table(dev, idx, prio)
        if not delete:
            table[1] += 1
            return nlwrite.u32_filter(False, idx, ROOT, prio, proto, minor,
                                      (TC_MAJOR << 16) | minor, nlwrite.prefix_keys(dst, offset))
        table[1] -= 1
        if table[1] <= 0:
            # the last filter of the family: the whole preference goes (`tc filter del dev
            # DEV parent 7470: pref P protocol ipv6`), as it came with the first. The kernel
            # drops an emptied preference by itself only when it is the qdisc's only one
            return nlwrite.u32_filter(True, idx, ROOT, prio, proto, 0)
        return nlwrite.u32_filter(True, idx, ROOT, prio, proto, table[0] | minor)

    def _u32_table(self, dev: str, idx: int, prio: int) -> list[int]:
        """[root hash table (htid << 20), filters in it] of u32 preference `prio` on `dev`,
        read from the kernel once per batch and kept current as the batch's requests are
        built (800: and none when there is no such preference)."""
        if dev not in self._u32_tables:
            tables: dict[int, list[int]] = {}
            sock = nldump.open_in(self.target.inside)
            with contextlib.closing(sock):
                for f in nldump.dump_tc(sock, uapi.RTM_GETTFILTER, idx, ROOT):
                    if f.kind != "u32" or not f.handle:
                        continue
                    entry = tables.setdefault(f.info >> 16, [f.handle & 0xFFF00000, 0])
                    if f.handle & 0xFFF:  # a filter (node), not a hash table
                        entry[1] += 1
            self._u32_tables[dev] = tables
        return self._u32_tables[dev].setdefault(prio, [U32_HT << 20, 0])

    def add_filter(self, dev: str, minor: int, dst: str) -> None:
        """Add the u32 filter sending packets for `dst` to class `minor`."""
        self.run([self.filter_request(False, dev, minor, dst)])

    def del_filter(self, dev: str, minor: int, dst: str = "0.0.0.0/0") -> None:
        """Delete the u32 filter of class `minor` (for an IPv6 `dst`: at its preference)."""
        self.run([self.filter_request(True, dev, minor, dst)])
