"""Diff: desired HostState vs observed host -> ordered operations.

Two rules keep the agent safe on a shared host:
- A desired object that is already present (whoever made it) costs nothing.
- Deletion only ever removes objects that carry the agent's mark (route/rule/address protocol
  RT_PROTO, the HTB root TC_MAJOR:) and are no longer desired. Those are exactly the objects
  earlier applies created (last-applied minus desired) plus any orphan a crashed apply left;
  a foreign object is never deleted.

`check_host` runs first: what the schema cannot know without looking at the host (links exist,
MACs match, gateways sit on a link, no foreign qdisc in the way, tc offload available)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from topoagent.apply.kernel_ops import (
    AddAddress,
    AddFilter,
    AddQdisc,
    AddRule,
    DelAddress,
    DelClass,
    DelFilter,
    DelQdisc,
    DelRoute,
    DelRule,
    Op,
    SetClass,
    SetLink,
    SetRootRate,
    SetRoute,
    SetSysctl,
    ordered,
    route_text,
    rule_text,
)
from topoagent.apply.ovs import check_ovs, diff_ovs, internal_ports
from topoagent.observe.host import (
    IP6_FORWARD,
    IP_FORWARD,
    MULTIPATH_HASH,
    MULTIPATH_HASH6,
    Observed,
    ObsQos,
    rp_filter_path,
)
from topoagent.state.host import (
    RT_PROTO,
    HostState,
    Interface,
    QosClass,
    Route,
    StateError,
    htb_credit,
)
from topoagent.state.values import is_ifname, is_link_local, name_text


def tc_offload_available() -> bool:
    """tc-offload forwarding needs cls_flower and act_pedit (kernel modules or built in)."""
    mods = Path("/lib/modules") / os.uname().release / "kernel/net/sched"

    def have(name: str) -> bool:
        return Path(f"/sys/module/{name}").exists() or any(mods.glob(f"{name}.ko*"))
    return have("cls_flower") and have("act_pedit")


def desired_sysctls(desired: HostState) -> dict[str, str]:
    """sysctl path -> value the desired state sets (ip_forward also when `forwarding` is
    present)."""
    out: dict[str, str] = {}
    forward = desired.sysctl.ip_forward
    if desired.forwarding is not None and forward is None:
        forward = True  # a forwarding host forwards in the kernel unless told otherwise
    if forward is not None:
        out[IP_FORWARD] = "1" if forward else "0"
    for dev, value in desired.sysctl.rp_filter.items():
        out[rp_filter_path(dev)] = str(value)
    if desired.sysctl.multipath_hash_policy is not None:
        out[MULTIPATH_HASH] = str(desired.sysctl.multipath_hash_policy)
    forward6 = desired.sysctl.ipv6_forwarding
    if desired.forwarding is not None and forward6 is None and _speaks_ipv6(desired):
        forward6 = True  # as ip_forward: a forwarding host forwards each family it has
    if forward6 is not None:
        out[IP6_FORWARD] = "1" if forward6 else "0"
    if desired.sysctl.ipv6_multipath_hash_policy is not None:
        out[MULTIPATH_HASH6] = str(desired.sysctl.ipv6_multipath_hash_policy)
    return out


def _speaks_ipv6(desired: HostState) -> bool:
    """Whether the state has an IPv6 address or route."""
    return (any(":" in a for i in desired.interfaces for a in i.addresses)
            or any(":" in r.dst for r in desired.routes))


def check_host(desired: HostState, obs: Observed) -> None:
    """Host-dependent validation; raises StateError naming each YAML path."""
    problems: list[tuple[str, str]] = []
    created = internal_ports(desired)  # OVS internal ports: made by this apply
    known = set(obs.links) | created
    for i, iface in enumerate(desired.interfaces):
        link = obs.links.get(iface.name)
        if link is None and iface.name in created:
            continue
        if link is None:
            problems.append((f"interfaces[{i}].name", f"no such link: {iface.name}"))
        elif iface.mac and (link.mac or "").lower() != iface.mac:
            problems.append((f"interfaces[{i}].mac",
                             f"link {iface.name} has MAC {link.mac}, not {iface.mac}"))
    for dev in desired.sysctl.rp_filter:
        if dev not in ("all", "default") and dev not in known:
            problems.append((f"sysctl.rp_filter.{dev}", f"no such link: {dev}"))
    if desired.forwarding is not None:
        if desired.forwarding.mode == "kernel" and desired.sysctl.ip_forward is False:
            problems.append(("sysctl.ip_forward", "false, but forwarding.mode is kernel"))
        if desired.forwarding.mode == "tc-offload" and not tc_offload_available():
            problems.append(("forwarding.mode", "tc-offload needs tc flower and pedit, which "
                             "this kernel does not have; use mode kernel here"))

    subnets = _subnets_after(desired, obs)
    links_of: dict[str, list[str]] = {}  # gateway -> links it is on (few gateways, many routes)
    for i, route in enumerate(desired.routes):
        hops = route.nexthops or [route]
        for j, hop in enumerate(hops):
            where = f"routes[{i}].nexthops[{j}]" if route.nexthops else f"routes[{i}]"
            if hop.dev is not None and hop.dev not in known:
                problems.append((f"{where}.dev", f"no such link: {hop.dev}"))
                continue
            if hop.via is None:
                continue
            if hop.dev is not None and is_link_local(hop.via):
                continue  # on its link by definition (fe80::/64 is on every IPv6 link)
            if hop.via not in links_of:
                gw = ipaddress.ip_address(hop.via)
                links_of[hop.via] = [dev for dev, nets in subnets.items() for n in nets
                                     if n.version == gw.version and gw in n]
            on = links_of[hop.via]
            if not on:
                problems.append((f"{where}.via", f"gateway {hop.via} is not on any link"))
            elif hop.dev is not None and hop.dev not in on:
                problems.append((f"{where}.via",
                                 f"gateway {hop.via} is not on link {hop.dev} (it is on "
                                 f"{', '.join(sorted(on))})"))
    for i, rule in enumerate(desired.rules):
        for key in ("iif", "oif"):
            dev = getattr(rule, key)
            if dev is not None and dev not in obs.links:
                problems.append((f"rules[{i}].{key}", f"no such link: {dev}"))
    problems += _foreign_conflicts(desired, obs)
    for i, q in enumerate(desired.qos):
        if q.dev not in obs.links:
            problems.append((f"qos[{i}].dev", f"no such link: {q.dev}"))
        elif q.driver == "tc" and q.dev in obs.foreign_qdiscs:
            problems.append((f"qos[{i}].dev", f"{q.dev} has a root qdisc the agent does not own "
                             f"({obs.foreign_qdiscs[q.dev]}); remove it first"))
    problems += check_ovs(desired, obs.ovs, getattr(obs.ovs, "db", None) or "the ovsdb socket")
    if problems:
        raise StateError(problems)


def _prefix_route_keys(desired: HostState) -> set[tuple[int, str, int]]:
    """Keys of the routes the kernel makes itself while the agent works (an address added or
    a link brought up gets its prefix route, in the main table; an IPv6 link its fe80::/64):
    a desired route at one of these keys replaces the kernel's (`SetRoute.exclusive` off)."""
    keys = {(254, "fe80::/64", 256)}
    for iface in desired.interfaces:
        for a in iface.addresses:
            net = ipaddress.ip_interface(a).network
            if net.prefixlen < net.max_prefixlen:
                keys.add((254, str(net), 256 if net.version == 6 else 0))
    return keys


def _foreign_conflicts(desired: HostState, obs: Observed) -> list[tuple[str, str]]:
    """A desired object whose key an object the agent does not own already holds (a route with
    the same table/dst/metric, a rule at the same priority, the same IP): the agent would have
    to replace or shadow someone else's object, and could not give it back. An identical
    foreign object is no conflict: it already is what is desired."""
    problems = []
    for i, route in enumerate(desired.routes):
        opaque = obs.opaque_routes.get(route.key)
        if opaque is not None:
            problems.append((f"routes[{i}]", f"a route the agent does not own has the same "
                             f"table/dst/metric: {opaque.text} (proto {opaque.proto}); remove "
                             f"it or change the metric"))
            continue
        have = obs.routes.get(route.key)
        if have is not None and have.proto != RT_PROTO and not _same_route(route, have.route):
            problems.append((f"routes[{i}]", f"a route the agent does not own has the same "
                             f"table/dst/metric: {route_text(have.route)} (proto "
                             f"{have.proto}); remove it or change the metric"))
    foreign: dict[tuple, list] = {}  # (family, priority) -> rules not the agent's
    for o in obs.rules:
        if o.proto != RT_PROTO:
            foreign.setdefault((o.family, o.priority), []).append(o)
    for i, rule in enumerate(desired.rules):
        for o in foreign.get(rule.key, ()):
            if o.rule != rule:
                what = rule_text(o.rule) if o.rule is not None else "(not expressible here)"
                problems.append((f"rules[{i}].priority", f"a rule the agent does not own has "
                                 f"priority {o.priority}: {what} (protocol {o.proto})"))
    ips = {a.split("/")[0]: (dev, a, proto) for dev, addrs in obs.addresses.items()
           for a, proto in addrs.items()}
    for i, iface in enumerate(desired.interfaces):
        for j, a in enumerate(iface.addresses):
            found = ips.get(a.split("/")[0])
            if found is None:
                continue
            dev, have, proto = found
            if (proto != RT_PROTO or not is_ifname(dev)) and (dev, have) != (iface.name, a):
                problems.append((f"interfaces[{i}].addresses[{j}]", f"{have} on "
                                 f"{name_text(dev)} has this IP and is not the agent's "
                                 f"(proto {proto})"))
    return problems


def _subnets_after(desired: HostState, obs: Observed) -> dict[str, list]:
    """Connected subnets per link once the desired addresses are in place (foreign addresses
    stay, the agent's undesired ones go)."""
    out: dict[str, list] = {}
    wanted = {i.name: set(i.addresses) for i in desired.interfaces}
    for dev, addrs in obs.addresses.items():
        for a, proto in addrs.items():
            if proto != RT_PROTO or a in wanted.get(dev, ()):
                out.setdefault(dev, []).append(ipaddress.ip_interface(a).network)
    for dev, addrs in wanted.items():
        for a in addrs:
            out.setdefault(dev, []).append(ipaddress.ip_interface(a).network)
    return out


def _nodad(iface: Interface, address: str) -> bool:
    """Whether an IPv6 address goes on without duplicate address detection: `dad: false`, and
    always on the loopback (detection there is a formality, but until the kernel's work queue
    has run it the address is tentative: a route in the same batch could not use it as its
    source)."""
    return ":" in address and (iface.dad is False or (iface.name == "lo" and iface.dad is None))


def _same_route(want: Route, have: Route) -> bool:
    """`have` (observed) satisfies `want`: a next hop given without dev matches whatever dev the
    kernel resolved its gateway to."""
    if want.src != have.src:
        return False
    if not want.nexthops and not have.nexthops:  # the common case, without building lists
        return want.via == have.via and want.dev in (None, have.dev)
    w, h = want.hops(), have.hops()
    if len(w) != len(h):
        return False
    if all(x.dev is not None for x in w):
        return w == h
    return all(a.via == b.via and a.weight == b.weight and a.dev in (None, b.dev)
               for a, b in zip(w, sorted(h, key=lambda n: (n.via or "", n.dev or "")), strict=True))


def _same_class(a: QosClass, b: QosClass) -> bool:
    # the kernel keeps HTB rates in bytes/s
    return a.rate // 8 == b.rate // 8 and (a.ceil or a.rate) // 8 == (b.ceil or b.rate) // 8


def _credit_off(tree: ObsQos, minor: int, rate: int, ceil: int, mtu: int) -> bool:
    """Whether an agent HTB class on the host has other token credit (burst at `rate`, cburst
    at `ceil`) than the agent gives one (`topoagent.state.host.htb_credit`): less, as an agent
    of an earlier release made it (pyroute2's one-frame default) or someone changed it by hand;
    or more, as a class made for an MTU the kernel then refused keeps (two frames of 65536
    bytes). Either way the class is set again at the same rates. The kernel keeps the credit
    as whole microseconds of transmit time, and the credit is at least 4 ms of it, so 1% holds
    every rounding."""
    have = tree.credit.get(minor)
    if have is None:
        return False
    return any(abs(got - want) > 0.01 * want + 64
               for got, want in zip(have, (htb_credit(rate, mtu), htb_credit(ceil, mtu)),
                                    strict=True))


def diff(desired: HostState, obs: Observed) -> list[Op]:
    """Operations that take the observed host to the desired state, in dependency order."""
    ops: list[Op] = []
    created = {rp_filter_path(p) for p in internal_ports(desired) if p not in obs.links}
    for path, value in desired_sysctls(desired).items():
        old = obs.sysctl.get(path)
        if old is None and path in created:
            # an OVS internal port this apply creates starts with the `default` value
            old = obs.sysctl.get(rp_filter_path("default"), "0")
            if old != value:
                ops.append(SetSysctl(path, value, old, late=True))
        elif old is not None and old != value:
            ops.append(SetSysctl(path, value, old))

    for iface in desired.interfaces:
        link = obs.links.get(iface.name)
        if link is None:
            if iface.name in internal_ports(desired):  # an OVS internal port made by this apply
                if iface.mtu is not None or iface.up is not None:
                    ops.append(SetLink(iface.name, iface.mtu, iface.up, None, None))
                ops += [AddAddress(iface.name, a, nodad=_nodad(iface, a))
                        for a in iface.addresses]
            continue  # else check_host reports it
        mtu = iface.mtu if iface.mtu is not None and iface.mtu != link.mtu else None
        up = iface.up if iface.up is not None and iface.up != link.up else None
        if mtu is not None or up is not None:
            ops.append(SetLink(iface.name, mtu, up, link.mtu if mtu else None,
                               link.up if up is not None else None))
        have = obs.addresses.get(iface.name, {})
        ops += [AddAddress(iface.name, a, nodad=_nodad(iface, a))
                for a in iface.addresses if a not in have]
    wanted_addrs = {(i.name, a) for i in desired.interfaces for a in i.addresses}
    for dev, addrs in obs.addresses.items():
        ops += [DelAddress(dev, a, proto) for a, proto in addrs.items()
                if proto == RT_PROTO and (dev, a) not in wanted_addrs and is_ifname(dev)]

    wanted_routes = {r.key: r for r in desired.routes}
    kernel_made = _prefix_route_keys(desired)
    for route in desired.routes:
        have = obs.routes.get(route.key)
        if route.key in obs.opaque_routes:
            continue  # someone else's (check_host reports it): never replaced
        if have is None:  # create only, unless the kernel may make it during this apply
            ops.append(SetRoute(route, exclusive=route.key not in kernel_made))
        elif not _same_route(route, have.route):
            ops.append(SetRoute(route, RT_PROTO, have.route, have.proto))
    ops += [DelRoute(o.route, o.proto) for key, o in obs.routes.items()
            if o.proto == RT_PROTO and key not in wanted_routes]

    present_rules = {o.rule for o in obs.rules if o.rule is not None}
    ops += [AddRule(r) for r in desired.rules if r not in present_rules]
    wanted_rules = set(desired.rules)
    ops += [DelRule(o.rule, o.proto) for o in obs.owned_rules() if o.rule not in wanted_rules]

    ops += _diff_qos(desired, obs)
    ops += diff_ovs(desired, obs.ovs)
    return ordered(ops)


def _diff_qos(desired: HostState, obs: Observed) -> list[Op]:
    ops: list[Op] = []
    wanted = {q.dev: q for q in desired.qos if q.driver == "tc"}  # ovs: topoagent.apply.ovs
    for dev, tree in obs.qos.items():
        if dev not in wanted:
            classes = tuple(c for _, c in sorted(tree.recreatable().items()))
            ops.append(DelQdisc(dev, tree.rate or 0, classes))
    for dev, q in wanted.items():
        if dev in obs.foreign_qdiscs:
            continue  # check_host reports it
        classes = {c.id: c for c in q.resolved_classes()}
        tree = obs.qos.get(dev)
        if tree is None or tree.rate is None:
            if tree is not None:  # our qdisc without its root class: rebuild it
                ops.append(DelQdisc(dev, 0, ()))
            ops.append(AddQdisc(dev, q.rate))
            ops += [SetClass(dev, c) for c in classes.values()]
            ops += [AddFilter(dev, c.id, c.dst) for c in classes.values()]
            continue
        # the device's MTU once the interfaces are applied: the credit is two frames at least
        mtu = next((i.mtu for i in desired.interfaces if i.name == dev and i.mtu), None) or (
            obs.links[dev].mtu if dev in obs.links else 1500)
        if tree.rate // 8 != q.rate // 8 or _credit_off(tree, 1, q.rate, q.rate, mtu):
            ops.append(SetRootRate(dev, q.rate, tree.rate))
        ops += [DelFilter(dev, minor, dst) for minor, (dst, target) in tree.filters.items()
                if (c := classes.get(minor)) is None or c.dst != dst or target != minor]
        ops += [DelClass(dev, c) for minor, c in tree.recreatable().items()
                if minor not in classes]
        for minor, c in classes.items():
            have = tree.classes.get(minor)
            if have is None:
                ops.append(SetClass(dev, c))
            elif not _same_class(c, have) or _credit_off(tree, minor, c.rate, c.ceil or c.rate,
                                                         mtu):
                ops.append(SetClass(dev, c, QosClass(id=minor, dst=c.dst, rate=have.rate,
                                                     ceil=have.ceil)))
            f = tree.filters.get(minor)
            if f is None or f != (c.dst, minor):
                ops.append(AddFilter(dev, minor, c.dst))
    return ops
