"""Observe: read a host's network state with pyroute2 (netlink) and /proc/sys.

The result is an `Observed` snapshot in the schema's canonical values, with each object's
ownership mark (route/rule/address protocol, tc handle), so the diff can tell the agent's objects
from foreign ones. `to_host_state` turns the representable part back into a HostState for
`topo-agent show`; feeding that to `diff` reports nothing to do."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from topoagent.observe.nldump import (
    RawLink,
    RawRoute,
    RawRule,
    RawTc,
    dump_addrs,
    dump_links,
    dump_routes,
    dump_rules,
    dump_tc,
    htb_credit_bytes,
    htb_rates,
    open_in,
    u32_keys,
)
from topoagent.observe.ovs import observe_ovs, observed_sections
from topoagent.observe.uapi import RTM_GETQDISC, RTM_GETTCLASS, RTM_GETTFILTER
from topoagent.state.host import (
    RT_PROTO,
    RULE_PRIORITY_MAX,
    RULE_PRIORITY_MIN,
    TC_MAJOR,
    HostState,
    Interface,
    Nexthop,
    Qos,
    QosClass,
    Route,
    Rule,
    Sysctl,
)
from topoagent.state.ovs import OvsState
from topoagent.state.values import LOCAL_TABLE, is_ifname, is_link_local, name_text
from topoagent.target import Target

RTN_UNICAST = 1
RTN_NAMES = {2: "local", 3: "broadcast", 4: "anycast", 5: "multicast", 6: "blackhole",
             7: "unreachable", 8: "prohibit", 9: "throw", 10: "nat", 11: "xresolve"}
FR_ACT_TO_TBL = 1
IFF_UP = 0x1
TC_H_ROOT = 0xFFFFFFFF
UNSET = 0xFFFFFFFF
U32_PRIO = 10  # every agent u32 filter for an IPv4 destination lives at this preference
U32_PRIO6 = 11  # and for an IPv6 one at this (one protocol per preference)
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
IPV4_DST_OFFSET, IPV6_DST_OFFSET = 16, 24  # the destination in each family's header
MTU_MIN, MTU_MAX = 68, 65536  # what an Interface can say (lo may be set as low as 0)
IP_FORWARD = "net/ipv4/ip_forward"
MULTIPATH_HASH = "net/ipv4/fib_multipath_hash_policy"
IP6_FORWARD = "net/ipv6/conf/all/forwarding"
MULTIPATH_HASH6 = "net/ipv6/fib_multipath_hash_policy"


def rp_filter_path(dev: str) -> str:
    """The sysctl path (under /proc/sys) of `dev`'s rp_filter."""
    return f"net/ipv4/conf/{dev}/rp_filter"


@dataclass
class ObsLink:
    """An observed link: index, name, MAC, MTU and state."""

    index: int
    name: str
    mac: str | None
    mtu: int
    up: bool


@dataclass
class ObsRoute:
    """An observed route with its protocol (the agent's mark or another owner's)."""

    route: Route
    proto: int


@dataclass
class OpaqueRoute:
    """A route the schema cannot express (another type than unicast, a link name it cannot
    spell, one next hop as multipath): never the agent's, never replaced or deleted; a desired
    route with its key is an error naming it (`text`, as `ip route` prints it)."""

    text: str
    proto: int


@dataclass
class ObsRule:
    """A rule as the kernel has it. `rule` is set when the schema can express it."""

    rule: Rule | None
    proto: int
    priority: int = 0
    family: str = "ipv4"


@dataclass
class ObsQos:
    """The agent's HTB tree on one interface (root handle TC_MAJOR:)."""

    dev: str
    rate: int | None  # root class 1 rate, bit/s
    classes: dict[int, QosClass] = field(default_factory=dict)  # minor -> class (dst unset)
    # minor -> (burst, cburst) bytes (1: the root)
    credit: dict[int, tuple[int, int]] = field(default_factory=dict)
    filters: dict[int, tuple[str, int]] = field(default_factory=dict)  # node -> (dst, class minor)

    def classified(self) -> dict[int, QosClass]:
        """Classes with the destination their filter matches (minor -> class); classes no
        filter points at are left out."""
        return {minor: self.classes[minor].model_copy(update={"dst": dst})
                for dst, minor in sorted(self.filters.values(), key=lambda f: f[1])
                if minor in self.classes}

    def recreatable(self) -> dict[int, QosClass]:
        """Every class, with its filter's destination where one points at it (0.0.0.0/0
        otherwise): what an inverse needs to put the class back."""
        return {**self.classes, **self.classified()}


@dataclass
class Observed:
    """A snapshot of the host: links, addresses, routes, rules, sysctls, QoS trees and OVS, with
    ownership marks."""

    links: dict[str, ObsLink] = field(default_factory=dict)
    addresses: dict[str, dict[str, int]] = field(default_factory=dict)  # dev -> {a/len: proto}
    routes: dict[tuple, ObsRoute] = field(default_factory=dict)  # (table, dst, metric) -> route
    opaque_routes: dict[tuple, OpaqueRoute] = field(default_factory=dict)  # same keys
    rules: list[ObsRule] = field(default_factory=list)
    qos: dict[str, ObsQos] = field(default_factory=dict)
    foreign_qdiscs: dict[str, str] = field(default_factory=dict)  # dev -> "kind handle"
    sysctl: dict[str, str] = field(default_factory=dict)  # /proc/sys path -> value
    ovs: Any = None  # topoagent.observe.ovs.ObsOvs when an ovsdb-server answers, else None

    def owned_rules(self) -> list[ObsRule]:
        """The policy rules carrying the agent's protocol mark."""
        return [r for r in self.rules if r.proto == RT_PROTO and r.rule is not None]


def observe(target: Target) -> Observed:
    """Read the target's network state (rtnetlink dumps, /proc/sys, OVS when configured)."""
    obs = Observed()
    sock = open_in(target.inside)
    try:
        names = _links(dump_links(sock), obs)
        for index, addr, proto in dump_addrs(sock):
            dev = names.get(index)
            # link-local addresses are the kernel's, one per link: left alone, and out of sight
            if dev is not None and not is_link_local(addr):
                obs.addresses.setdefault(dev, {})[addr] = proto
        _routes(dump_routes(sock), obs, names)
        _rules(dump_rules(sock), obs)
        _qos(sock, obs, names)
    finally:
        sock.close()
    paths = [IP_FORWARD, MULTIPATH_HASH, IP6_FORWARD, MULTIPATH_HASH6] + [rp_filter_path(n)
                                            for n in ("all", "default", *obs.links)]
    with target.inside():
        for p in paths:
            try:
                with open(f"/proc/sys/{p}") as f:
                    obs.sysctl[p] = f.read().strip()
            except FileNotFoundError:
                pass

    obs.ovs = observe_ovs(target)
    return obs


def _links(raw: list[RawLink], obs: Observed) -> dict[int, str]:
    for link in raw:
        obs.links[link.name] = ObsLink(index=link.index, name=link.name, mac=link.mac,
                                       mtu=link.mtu, up=bool(link.flags & IFF_UP))
    return {link.index: link.name for link in raw}


def _routes(raw: list[RawRoute], obs: Observed, names: dict[int, str]) -> None:
    for r in raw:
        # the local table is the kernel's; a TOS is part of the kernel's key, so a route
        # with one is never in the way of the agent's (which have none)
        if r.table == LOCAL_TABLE or r.tos:
            continue
        if r.dst.startswith("fe80:") and is_link_local(r.dst):
            continue  # the kernel's link-local prefix (it comes and goes with the link): left alone
        route = _route(r, names) if r.type == RTN_UNICAST else None
        if route is None:
            obs.opaque_routes[(r.table, r.dst, r.metric)] = OpaqueRoute(
                _raw_route_text(r, names), r.proto)
        else:
            obs.routes[route.key] = ObsRoute(route=route, proto=r.proto)


def _route(r: RawRoute, names: dict[int, str]) -> Route | None:
    """The unicast route `r` in the schema, or None when the schema cannot express it (a
    link name it cannot spell, one next hop as multipath)."""
    hops = r.multipath or [(r.gateway, r.oif, 1)]
    if any(oif is not None and not is_ifname(names.get(oif)) for _, oif, _ in hops):
        return None
    # every field given: model_construct looks a default factory's signature up each time
    fields: dict = dict(dst=r.dst, table=r.table, metric=r.metric, src=r.prefsrc, via=None,
                        dev=None, nexthops=[])
    if r.multipath:
        fields["nexthops"] = [(gw, names.get(oif), w) for gw, oif, w in r.multipath]
    else:
        fields["via"] = r.gateway
        fields["dev"] = names.get(r.oif) if r.oif is not None else None
    if _plain(fields):
        # the kernel's values are canonical already (inet_ntop text, host bits clear, names
        # checked above): validating 10,000 routes again cost 0.1 s per observe
        if r.multipath:
            fields["nexthops"] = [Nexthop.model_construct(via=gw, dev=dev, weight=w)
                                  for gw, dev, w in fields["nexthops"]]
        return Route.model_construct(**fields)
    if r.multipath:
        fields["nexthops"] = [dict(via=gw, dev=dev, weight=w) for gw, dev, w in fields["nexthops"]]
    try:
        return Route(**fields)
    except ValueError:
        return None


def _plain(fields: dict) -> bool:
    """Whether a route read from the kernel is one the schema takes as it is: one next hop
    with a gateway or a device, or two or more distinct ones with weights in range."""
    hops = fields["nexthops"]
    if not hops:
        return fields["via"] is not None or fields["dev"] is not None
    return (len(hops) >= 2 and len({(gw, dev) for gw, dev, _ in hops}) == len(hops)
            and all((gw is not None or dev is not None) and 1 <= w <= 256
                    for gw, dev, w in hops))


def _raw_route_text(r: RawRoute, names: dict[int, str]) -> str:
    """A route as `ip route` prints it, from the raw dump (link names quoted when odd)."""
    words = [RTN_NAMES[r.type]] if r.type in RTN_NAMES else []
    words.append(r.dst)
    if r.table != 254:
        words.append(f"table {r.table}")
    if r.metric:
        words.append(f"metric {r.metric}")
    for gw, oif, weight in r.multipath or [(r.gateway, r.oif, 0)]:
        words += ["nexthop"] * bool(r.multipath) + [f"via {gw}"] * bool(gw)
        if oif is not None:
            words.append(f"dev {name_text(names.get(oif, f'if{oif}'))}")
        words += [f"weight {weight}"] * bool(r.multipath)
    words += [f"src {r.prefsrc}"] * bool(r.prefsrc)
    return " ".join(words)


def _rules(raw: list[RawRule], obs: Observed) -> None:
    for r in raw:
        plain = (r.action == FR_ACT_TO_TBL and r.tos == 0 and not r.exotic
                 and RULE_PRIORITY_MIN <= r.priority <= RULE_PRIORITY_MAX
                 and r.fwmask in (None, UNSET)
                 # the kernel reports these two on every rule; all ones means unused
                 and r.suppress_prefixlen in (None, UNSET)
                 and r.suppress_ifgroup in (None, UNSET)
                 and r.table not in (0, LOCAL_TABLE))
        rule = None
        fam = "ipv6" if r.family == socket.AF_INET6 else "ipv4"
        if plain and _plain_rule(r):  # canonical already: no second validation (5,000 rules)
            rule = Rule.model_construct(priority=r.priority, table=r.table, fwmark=r.fwmark,
                                        iif=r.iif, oif=r.oif, to=r.dst, from_=r.src,
                                        family=fam)
        elif plain:
            try:
                rule = Rule(priority=r.priority, table=r.table, fwmark=r.fwmark, iif=r.iif,
                            oif=r.oif, to=r.dst, family=fam, **{"from": r.src})
            except ValueError:
                rule = None
        obs.rules.append(ObsRule(rule=rule, proto=r.proto, priority=r.priority, family=fam))


def _plain_rule(r: RawRule) -> bool:
    """Whether the schema takes a rule's values as the kernel gives them: names it can spell,
    a mark of at least 1, networks without host bits."""
    return (all(n is None or is_ifname(n) for n in (r.iif, r.oif))
            and (r.fwmark is None or r.fwmark >= 1)
            and all(n is None or host_bits_clear(n) for n in (r.src, r.dst)))


def host_bits_clear(net: str) -> bool:
    """Whether network text `a.b.c.d/len` (or IPv6) has no bits set past its prefix."""
    ip, _, plen = net.partition("/")
    raw = socket.inet_pton(socket.AF_INET6 if ":" in ip else socket.AF_INET, ip)
    bits = len(raw) * 8
    return int.from_bytes(raw, "big") & ((1 << (bits - int(plen))) - 1) == 0


def _qos(sock, obs: Observed, names: dict[int, str]) -> None:
    roots = {q.ifindex: q for q in dump_tc(sock, RTM_GETQDISC) if q.parent == TC_H_ROOT}
    for ifindex, root in roots.items():
        dev = names.get(ifindex)
        if dev is None or root.handle == 0:
            continue  # the kernel's default qdisc: free for the agent to replace
        if root.handle >> 16 != TC_MAJOR or root.kind != "htb" or not is_ifname(dev):
            obs.foreign_qdiscs[dev] = f"{root.kind} {root.handle >> 16:x}:"
            continue
        tree = ObsQos(dev=dev, rate=None)
        for c in dump_tc(sock, RTM_GETTCLASS, ifindex):
            if c.handle >> 16 != TC_MAJOR or c.kind != "htb":
                continue
            rate, ceil = htb_rates(c)
            minor = c.handle & 0xFFFF
            tree.credit[minor] = htb_credit_bytes(c)
            if minor == 1:
                tree.rate = rate
            else:
                tree.classes[minor] = QosClass.model_construct(id=minor, dst="0.0.0.0/0",
                                                               rate=rate, ceil=ceil)
        for f in dump_tc(sock, RTM_GETTFILTER, ifindex, TC_MAJOR << 16):
            parsed = _u32_dst_filter(f)
            if parsed is not None:
                node, dst, minor = parsed
                tree.filters[node] = (dst, minor)
        obs.qos[dev] = tree


def _u32_dst_filter(f: RawTc) -> tuple[int, str, int] | None:
    """(node id, dst network, class minor) of an agent u32 filter matching one IPv4 or IPv6
    destination; None for hash-table entries and anything else."""
    if f.handle & 0xFFF == 0 or f.kind != "u32":
        return None
    proto = socket.ntohs(f.info & 0xFFFF)
    parsed = u32_keys(f)
    if parsed is None:
        return None
    classid, keys = parsed
    if classid >> 16 != TC_MAJOR:
        return None
    if proto == ETH_P_IPV6 and f.info >> 16 == U32_PRIO6:
        dst = _prefix(keys, IPV6_DST_OFFSET, 128)
    elif len(keys) == 1:  # IPv4 (kernels of old report the protocol of IPv4 filters oddly)
        dst = _prefix(keys, IPV4_DST_OFFSET, 32)
    else:
        return None
    return (f.handle & 0xFFF, dst, classid & 0xFFFF) if dst else None


def _prefix(keys: list[tuple[int, int, int]], offset: int, bits: int) -> str | None:
    """The network that u32 keys (mask, value, offset) match when they are an address's
    consecutive words from `offset` (full masks, the last one a prefix mask); None when they
    are anything else (mask 0, all traffic, is never one of the agent's)."""
    value, plen = 0, 0
    for k, (mask, val, off) in enumerate(keys):
        ones = bin(mask).count("1")
        if off != offset + 4 * k or mask == 0 or mask != (0xFFFFFFFF << (32 - ones)) & 0xFFFFFFFF:
            return None
        if plen % 32:  # a partial word before this one
            return None
        value |= (val & mask) << (bits - 32 * (k + 1))
        plen += ones
    if len(keys) > bits // 32:
        return None
    net = (ipaddress.IPv6Network if bits == 128 else ipaddress.IPv4Network)((value, plen))
    return str(net)


def to_host_state(obs: Observed) -> HostState:
    """The representable part of what is on the host, as a HostState (for `show`)."""
    named = [n for n in obs.links if is_ifname(n)]  # other names: foreign links, left out
    interfaces = [
        Interface(name=n, mac=link.mac if link.mac and link.mac != "00:00:00:00:00:00" else None,
                  addresses=sorted(obs.addresses.get(n, {})),
                  mtu=link.mtu if MTU_MIN <= link.mtu <= MTU_MAX else None, up=link.up)
        for n, link in ((n, obs.links[n]) for n in named)
    ]
    rp = {}
    for name in ("all", "default", *named):
        v = obs.sysctl.get(rp_filter_path(name))
        if v is not None:
            rp[name] = int(v)
    ip_forward = obs.sysctl.get(IP_FORWARD)
    mp_hash = obs.sysctl.get(MULTIPATH_HASH)
    ip6_forward = obs.sysctl.get(IP6_FORWARD)
    mp_hash6 = obs.sysctl.get(MULTIPATH_HASH6)
    qos = []
    for dev, tree in obs.qos.items():
        classes = list(tree.classified().values())
        if tree.rate is not None:
            qos.append(Qos(dev=dev, rate=tree.rate, classes=classes))
    base = dict(
        interfaces=interfaces,
        sysctl=Sysctl(ip_forward=None if ip_forward is None else ip_forward == "1", rp_filter=rp,
                      multipath_hash_policy=None if mp_hash is None else int(mp_hash),
                      ipv6_forwarding=None if ip6_forward is None else ip6_forward == "1",
                      ipv6_multipath_hash_policy=None if mp_hash6 is None else int(mp_hash6)),
        routes=[r.route for r in obs.routes.values()],
        rules=[r.rule for r in obs.rules if r.rule is not None],
    )
    if obs.ovs is not None:  # the agent's bridges and their queues (topoagent.apply.ovs)
        section, ovs_qos = observed_sections(obs.ovs)
        on_ovs = {q["dev"] for q in ovs_qos}
        try:
            return HostState(**base, qos=[q for q in qos if q.dev not in on_ovs]
                             + [Qos.model_validate(q) for q in ovs_qos],
                             ovs=OvsState.model_validate(section) if section and
                             section["bridges"] else None)
        except (ValidationError, ValueError):  # changed behind the agent's back into
            pass  # something no HostState can say (e.g. queues above the link): left out
    return HostState(**base, qos=qos)
