"""Observe: read a host's network state with pyroute2 (netlink) and /proc/sys.

The result is an `Observed` snapshot in the schema's canonical values, with each object's
ownership mark (route/rule/address protocol, tc handle), so the diff can tell the agent's objects
from foreign ones. `to_host_state` turns the representable part back into a HostState for
`topo-agent show`; feeding that to `diff` reports nothing to do."""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass, field

from pyroute2 import IPRoute

from topoagent.state import (
    LOCAL_TABLE,
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
from topoagent.target import Target

RTN_UNICAST = 1
FR_ACT_TO_TBL = 1
IFF_UP = 0x1
TC_H_ROOT = 0xFFFFFFFF
UNSET = 0xFFFFFFFF
U32_PRIO = 10  # every agent u32 filter lives at this preference
IP_FORWARD = "net/ipv4/ip_forward"


def rp_filter_path(dev: str) -> str:
    return f"net/ipv4/conf/{dev}/rp_filter"


@dataclass
class ObsLink:
    index: int
    name: str
    mac: str | None
    mtu: int
    up: bool


@dataclass
class ObsRoute:
    route: Route
    proto: int


@dataclass
class ObsRule:
    """A rule as the kernel has it. `rule` is set when the schema can express it."""

    rule: Rule | None
    proto: int
    summary: tuple  # every field, for exact before/after comparison of foreign rules too


@dataclass
class ObsQos:
    """The agent's HTB tree on one interface (root handle TC_MAJOR:)."""

    dev: str
    rate: int | None  # root class 1 rate, bit/s
    classes: dict[int, QosClass] = field(default_factory=dict)  # minor -> class (dst unset)
    filters: dict[int, tuple[str, int]] = field(default_factory=dict)  # node -> (dst, class minor)


@dataclass
class Observed:
    links: dict[str, ObsLink] = field(default_factory=dict)
    addresses: dict[str, dict[str, int]] = field(default_factory=dict)  # dev -> {a/len: proto}
    routes: dict[tuple, ObsRoute] = field(default_factory=dict)  # (table, dst, metric) -> route
    rules: list[ObsRule] = field(default_factory=list)
    qos: dict[str, ObsQos] = field(default_factory=dict)
    foreign_qdiscs: dict[str, str] = field(default_factory=dict)  # dev -> "kind handle"
    sysctl: dict[str, str] = field(default_factory=dict)  # /proc/sys path -> value

    def owned_rules(self) -> list[ObsRule]:
        return [r for r in self.rules if r.proto == RT_PROTO and r.rule is not None]


def observe(target: Target, ipr: IPRoute | None = None) -> Observed:
    own = ipr is None
    ipr = ipr or target.iproute()
    try:
        obs = Observed()
        names = _links(ipr, obs)
        _addresses(ipr, obs, names)
        _routes(ipr, obs, names)
        _rules(ipr, obs)
        for link in obs.links.values():
            _qos(ipr, obs, link)
        paths = [IP_FORWARD] + [rp_filter_path(n) for n in ("all", "default", *obs.links)]
        with target.inside():
            for p in paths:
                try:
                    with open(f"/proc/sys/{p}") as f:
                        obs.sysctl[p] = f.read().strip()
                except FileNotFoundError:
                    pass
        return obs
    finally:
        if own:
            ipr.close()


def _links(ipr: IPRoute, obs: Observed) -> dict[int, str]:
    names = {}
    for msg in ipr.get_links():
        name = msg.get_attr("IFLA_IFNAME")
        obs.links[name] = ObsLink(
            index=msg["index"],
            name=name,
            mac=msg.get_attr("IFLA_ADDRESS"),
            mtu=msg.get_attr("IFLA_MTU"),
            up=bool(msg["flags"] & IFF_UP),
        )
        names[msg["index"]] = name
    return names


def _addresses(ipr: IPRoute, obs: Observed, names: dict[int, str]) -> None:
    for msg in ipr.get_addr(family=socket.AF_INET):
        dev = names.get(msg["index"])
        if dev is None:
            continue
        addr = f"{msg.get_attr('IFA_ADDRESS') or msg.get_attr('IFA_LOCAL')}/{msg['prefixlen']}"
        obs.addresses.setdefault(dev, {})[addr] = msg.get_attr("IFA_PROTO") or 0


def _routes(ipr: IPRoute, obs: Observed, names: dict[int, str]) -> None:
    for msg in ipr.get_routes(family=socket.AF_INET):
        table = msg.get_attr("RTA_TABLE") or msg["table"]
        if table == LOCAL_TABLE or msg["type"] != RTN_UNICAST:
            continue
        dst = f"{msg.get_attr('RTA_DST') or '0.0.0.0'}/{msg['dst_len']}"
        fields = dict(dst=dst, table=table, metric=msg.get_attr("RTA_PRIORITY") or 0,
                      src=msg.get_attr("RTA_PREFSRC"))
        multipath = msg.get_attr("RTA_MULTIPATH")
        if multipath:
            fields["nexthops"] = [
                Nexthop(via=_gateway(nh), dev=names.get(nh["oif"]), weight=nh["hops"] + 1)
                for nh in multipath
            ]
        else:
            fields["via"] = msg.get_attr("RTA_GATEWAY")
            fields["dev"] = names.get(msg.get_attr("RTA_OIF"))
        try:
            route = Route(**fields)
        except ValueError:  # not expressible in the schema (e.g. one-hop multipath): skip it
            continue
        obs.routes[route.key] = ObsRoute(route=route, proto=msg["proto"])


def _gateway(nh) -> str | None:
    for name, value in nh.get("attrs", []):
        if name == "RTA_GATEWAY":
            return value
    return None


def _rules(ipr: IPRoute, obs: Observed) -> None:
    for msg in ipr.get_rules(family=socket.AF_INET):
        a = {name: value for name, value in msg["attrs"]}
        prio = a.get("FRA_PRIORITY", 0)
        table = a.get("FRA_TABLE", msg["table"])
        src = f"{a['FRA_SRC']}/{msg['src_len']}" if "FRA_SRC" in a else None
        dst = f"{a['FRA_DST']}/{msg['dst_len']}" if "FRA_DST" in a else None
        proto = a.get("FRA_PROTOCOL", 0)
        summary = (prio, msg["action"], table, src, dst, a.get("FRA_FWMARK"),
                   a.get("FRA_FWMASK"), a.get("FRA_IIFNAME"), a.get("FRA_OIFNAME"), msg["tos"],
                   proto)
        rule = None
        plain = (msg["action"] == FR_ACT_TO_TBL and msg["tos"] == 0
                 and RULE_PRIORITY_MIN <= prio <= RULE_PRIORITY_MAX
                 and a.get("FRA_FWMASK", 0xFFFFFFFF) == 0xFFFFFFFF
                 # the kernel reports these two on every rule; -1 means unused
                 and a.get("FRA_SUPPRESS_PREFIXLEN", UNSET) == UNSET
                 and a.get("FRA_SUPPRESS_IFGROUP", UNSET) == UNSET
                 and not set(a) & {"FRA_SPORT_RANGE", "FRA_DPORT_RANGE", "FRA_IP_PROTO",
                                   "FRA_UID_RANGE", "FRA_GOTO"})
        if plain and table not in (0, LOCAL_TABLE):
            try:
                rule = Rule(priority=prio, table=table, fwmark=a.get("FRA_FWMARK"),
                            iif=a.get("FRA_IIFNAME"), oif=a.get("FRA_OIFNAME"),
                            to=dst, **{"from": src})
            except ValueError:
                rule = None
        obs.rules.append(ObsRule(rule=rule, proto=proto, summary=summary))


def _qos(ipr: IPRoute, obs: Observed, link: ObsLink) -> None:
    root = None
    for q in ipr.get_qdiscs(index=link.index):
        if q["parent"] == TC_H_ROOT:
            root = q
    if root is None or root["handle"] == 0:
        return  # the kernel's default qdisc: free for the agent to replace
    kind = root.get_attr("TCA_KIND")
    if root["handle"] >> 16 != TC_MAJOR or kind != "htb":
        obs.foreign_qdiscs[link.name] = f"{kind} {root['handle'] >> 16:x}:"
        return
    tree = ObsQos(dev=link.name, rate=None)
    for c in ipr.get_classes(index=link.index):
        if c["handle"] >> 16 != TC_MAJOR:
            continue
        rate, ceil = _htb_rates(c)
        minor = c["handle"] & 0xFFFF
        if minor == 1:
            tree.rate = rate
        else:
            tree.classes[minor] = QosClass(id=minor, dst="0.0.0.0/0", rate=rate, ceil=ceil)
    for f in ipr.get_filters(index=link.index, parent=TC_MAJOR << 16):
        parsed = _u32_dst_filter(f)
        if parsed is not None:
            node, dst, minor = parsed
            tree.filters[node] = (dst, minor)
    obs.qos[link.name] = tree


def _htb_rates(msg) -> tuple[int, int]:
    opts = msg.get_attr("TCA_OPTIONS")
    parms = opts.get_attr("TCA_HTB_PARMS")
    rate = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
    ceil = opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
    return rate * 8, ceil * 8


def _u32_dst_filter(msg) -> tuple[int, str, int] | None:
    """(node id, dst network, class minor) of an agent u32 filter matching one IPv4 destination.

    pyroute2 0.9.7 decodes the keys of TCA_U32_SEL four bytes too early, so the keys are read
    here from the raw attribute: tc_u32_sel is 16 bytes after the 4-byte attribute header, then
    nkeys tc_u32_key of {__be32 mask, __be32 val, int off, int offmask} (off in host order)."""
    handle = msg["handle"]
    if handle & 0xFFF == 0 or msg.get_attr("TCA_KIND") != "u32":
        return None  # hash-table entries, not filters
    opts = msg.get_attr("TCA_OPTIONS")
    if opts is None:
        return None
    sel = opts.get_attr("TCA_U32_SEL")
    classid = opts.get_attr("TCA_U32_CLASSID")
    if sel is None or classid is None or classid >> 16 != TC_MAJOR or sel["nkeys"] != 1:
        return None
    mask, val = struct.unpack_from(">II", sel.data, sel.offset + 20)
    (off,) = struct.unpack_from("=i", sel.data, sel.offset + 28)  # host byte order
    if off != 16:  # IPv4 destination address
        return None
    prefix = bin(mask).count("1")
    dst = ipaddress.IPv4Network((val & mask, prefix))
    return handle & 0xFFF, str(dst), classid & 0xFFFF


def to_host_state(obs: Observed) -> HostState:
    """The representable part of what is on the host, as a HostState (for `show`)."""
    interfaces = [
        Interface(name=n, mac=link.mac if link.mac and link.mac != "00:00:00:00:00:00" else None,
                  addresses=sorted(obs.addresses.get(n, {})), mtu=link.mtu, up=link.up)
        for n, link in obs.links.items()
    ]
    rp = {}
    for name in ("all", "default", *obs.links):
        v = obs.sysctl.get(rp_filter_path(name))
        if v is not None:
            rp[name] = int(v)
    ip_forward = obs.sysctl.get(IP_FORWARD)
    qos = []
    for dev, tree in obs.qos.items():
        by_minor = {minor: dst for dst, minor in tree.filters.values()}
        classes = [QosClass(id=m, dst=by_minor[m], rate=c.rate, ceil=c.ceil)
                   for m, c in sorted(tree.classes.items()) if m in by_minor]
        if tree.rate is not None:
            qos.append(Qos(dev=dev, rate=tree.rate, classes=classes))
    return HostState(
        interfaces=interfaces,
        sysctl=Sysctl(ip_forward=None if ip_forward is None else ip_forward == "1", rp_filter=rp),
        routes=[r.route for r in obs.routes.values()],
        rules=[r.rule for r in obs.rules if r.rule is not None],
        qos=qos,
    )
