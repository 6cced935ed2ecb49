"""Management-connection guard: a plan must not cut off the operator who applies it.

The connection the agent was reached over (IPv4 or IPv6) is known from SSH_CONNECTION
("client_ip client_port server_ip server_port", set by sshd) or given explicitly (--mgmt
CLIENT_IP,SERVER_IP). An
operation that would remove the server address, take down or re-MTU its link, or change the
route the host uses to reach the client is refused unless the operator forces it.

That static guard sees operations one by one. After an apply, the agent also asks the kernel
(`ip route get`) for the path to the client and to every configured probe address
(`--mgmt-probe`: a gateway, the controller, a DNS name) and compares it with the path before:
a rule that diverts everything to another table, a blackhole, an MTU or link-state change of the
outgoing link all show up there; a changed path reverts the apply.

Neither sees a path that stays the same but starves: a QoS class that holds the operator's
traffic at 1 kbit/s, an ingress rule that steals the connection's packets, an Open vSwitch
bridge that takes the management NIC. `guard_state` reads the desired state for those before
anything changes (a class below the floor, `--mgmt-floor`, default MGMT_FLOOR). What it cannot
read in the state is caught at confirmation: `topo-agent confirm` needs a probe of real size
through the same path (topoagent.apply.probe, topoagent.apply.confirm)."""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

from topoagent.apply.kernel_ops import DelAddress, DelRoute, Op, SetLink, SetRoute
from topoagent.observe.host import Observed
from topoagent.state.host import HostState, StateError
from topoagent.state.values import format_rate

# The least a QoS class holding the management peer's traffic may guarantee (bit/s): an SSH
# session, an Ansible run and the confirmation probe stay usable next to saturated training
# traffic. A class is a guarantee under load, so its `rate` is what is judged.
MGMT_FLOOR = 10_000_000


@dataclass(frozen=True)
class Mgmt:
    """The management connection: the operator's address and the host address it connected to."""

    client: str  # the operator's address, as the host sees it
    server: str  # the host's address the operator connected to
    floor: int = MGMT_FLOOR  # bit/s: the least a QoS class holding `client` may guarantee

    @classmethod
    def from_env(cls) -> Mgmt | None:
        """The connection from $SSH_CONNECTION, or None when not run over SSH."""
        parts = os.environ.get("SSH_CONNECTION", "").split()
        return cls(client=parts[0], server=parts[2]) if len(parts) == 4 else None

    @classmethod
    def parse(cls, text: str) -> Mgmt:
        """The connection from `CLIENT_IP,SERVER_IP` (--mgmt); StateError when malformed."""
        client, _, server = text.partition(",")
        try:
            return cls(str(ipaddress.ip_address(client)), str(ipaddress.ip_address(server)))
        except ValueError:
            raise StateError([("--mgmt", f"expected CLIENT_IP,SERVER_IP, got {text!r}")]) from None


def _main_route_to(obs: Observed, ip: str) -> tuple | None:
    """Key of the main-table route the kernel would pick for `ip` (longest prefix, then metric)."""
    addr = ipaddress.ip_address(ip)
    best = None
    for key in obs.routes:
        table, dst, metric = key
        net = ipaddress.ip_network(dst)
        if table == 254 and addr in net:
            rank = (net.prefixlen, -metric)
            if best is None or rank > best[0]:
                best = (rank, key)
    return best[1] if best else None


def _holders(obs: Observed, mgmt: Mgmt) -> list[tuple[str, str]]:
    """(link, address) of every address with the server's IP."""
    return [(d, a) for d, addrs in obs.addresses.items() for a in addrs
            if a.split("/")[0] == mgmt.server]


def _links(obs: Observed, mgmt: Mgmt) -> tuple[str | None, str | None]:
    """(the link of the connection, the link packets to the client leave by): the first is
    the route's link when it holds the server address, else the holder's; either can be None."""
    holders = _holders(obs, mgmt)
    route_key = _main_route_to(obs, mgmt.client)
    route_dev = obs.routes[route_key].route.dev if route_key is not None else None
    dev = route_dev if route_dev in {d for d, _ in holders} else (
        holders[0][0] if holders else None)
    return dev, route_dev


def guard(ops: list[Op], obs: Observed, mgmt: Mgmt) -> None:
    """Raise StateError naming each operation that touches the management connection.

    The connection, not every address sharing its IP: deleting one of two addresses with the
    server's IP (say the agent's own /32 beside the foreign management /24) is no hit while
    the other stays; the link is the one the route to the client leaves by."""
    holders = _holders(obs, mgmt)
    route_key = _main_route_to(obs, mgmt.client)
    dev, _ = _links(obs, mgmt)
    deleted = {(op.dev, op.address) for op in ops if isinstance(op, DelAddress)}
    server_stays = any(h not in deleted for h in holders)
    client = ipaddress.ip_address(mgmt.client)
    problems = []
    for op in ops:
        hit = (
            (isinstance(op, DelAddress) and op.address.split("/")[0] == mgmt.server
             and not server_stays)
            or (isinstance(op, SetLink) and op.dev == dev)
            or (isinstance(op, DelRoute) and op.route.key == route_key)
            or (isinstance(op, SetRoute) and op.route.table == 254
                and client in ipaddress.ip_network(op.route.dst)
                and (route_key is None
                     or ipaddress.ip_network(op.route.dst).prefixlen
                     >= ipaddress.ip_network(route_key[1]).prefixlen))
        )
        if hit:
            problems.append(("", f"refusing to {op.describe()}: it carries the management "
                             f"connection {mgmt.client} -> {mgmt.server} (dev {dev}); "
                             f"use --force-mgmt to do it anyway"))
    if problems:
        raise StateError(problems)


def guard_state(desired: HostState, obs: Observed, mgmt: Mgmt) -> None:
    """Raise StateError naming each YAML path of `desired` that would starve the management
    connection while leaving its route alone: a QoS class holding the client below
    `mgmt.floor`, an offload rule redirecting the server's incoming packets, an OVS bridge
    taking the management NIC. Judged on the NIC the connection uses (the route's link and
    the server address's); when neither is known, a class holding the client on any link."""
    dev, route_dev = _links(obs, mgmt)
    nics = {d for d in (dev, route_dev) if d is not None}
    conn = f"the management connection {mgmt.client} -> {mgmt.server}"
    fix = "use --force-mgmt to do it anyway"
    problems = _class_problems(desired, mgmt, nics)
    server = ipaddress.ip_address(mgmt.server)
    rules = desired.forwarding.rules if desired.forwarding else []
    for k, rule in enumerate(rules):
        if (not nics or rule.dev in nics) and server in ipaddress.ip_network(rule.dst):
            problems.append((f"forwarding.rules[{k}].dst", f"{rule.dst} on {rule.dev} holds "
                             f"the server address of {conn}: its packets would be redirected "
                             f"to {rule.redirect}; {fix}"))
    for b, bridge in enumerate(desired.ovs.bridges if desired.ovs else []):
        for kind in ("ports", "internal"):
            for k, port in enumerate(getattr(bridge, kind)):
                if port in nics:
                    problems.append((f"ovs.bridges[{b}].{kind}[{k}]", f"{port} carries {conn}: "
                                     f"bridge {bridge.name} would take the management NIC "
                                     f"(its address stops answering); {fix}"))
    if problems:
        raise StateError(problems)


def _class_problems(desired: HostState, mgmt: Mgmt, nics: set[str]
                    ) -> list[tuple[str, str]]:
    """A QoS class (tc or ovs) on the management NIC whose dst holds the client and whose
    guaranteed rate is below the floor."""
    client = ipaddress.ip_address(mgmt.client)
    out = []
    for i, q in enumerate(desired.qos):
        if nics and q.dev not in nics:
            continue
        for j, c in enumerate(q.classes):
            if client in ipaddress.ip_network(c.dst) and c.rate < mgmt.floor:
                out.append((f"qos[{i}].classes[{j}].rate",
                            f"{format_rate(c.rate)} for {_short(c.dst)} holds the management "
                            f"peer {mgmt.client} (the connection {mgmt.client} -> "
                            f"{mgmt.server} over {q.dev}) below the management floor "
                            f"{format_rate(mgmt.floor)} (--mgmt-floor): SSH to this host "
                            "would starve; use --force-mgmt to do it anyway"))
    return out


def _short(net: str) -> str:
    """A /32 (or IPv6 /128) as its address, as the state usually spells it."""
    return net.removesuffix("/128") if ":" in net else net.removesuffix("/32")


def route_get(ipr, ip: str, src: str | None = None) -> str:
    """What `ip route get IP [from SRC]` says, with the MTU and state of the outgoing link: the
    path a packet to `ip` takes (rules, tables, blackhole/unreachable routes all included)."""
    from pyroute2.netlink.exceptions import NetlinkError  # pyroute2: only when a path is checked

    kw = {"dst": ip, **({"src": src} if src else {})}
    try:
        msg = ipr.route("get", **kw)[0]
    except NetlinkError as e:
        if src:  # the source address went away: that is a change of path too
            return f"{route_get(ipr, ip)} (from {src}: {e.args[-1]})"
        return f"unroutable: {e.args[-1]}"
    oif = msg.get_attr("RTA_OIF")
    parts = [f"type {msg['type']}"]
    gw = msg.get_attr("RTA_GATEWAY")
    if gw:
        parts.append(f"via {gw}")
    if oif is not None:
        links = ipr.get_links(oif)
        if links:
            link = links[0]
            up = "up" if link["flags"] & 1 else "down"
            parts.append(f"dev {link.get_attr('IFLA_IFNAME')} mtu {link.get_attr('IFLA_MTU')} "
                         f"{up}")
    for attr, word in (("RTA_PREFSRC", "src"), ("RTA_TABLE", "table")):
        v = msg.get_attr(attr)
        if v is not None:
            parts.append(f"{word} {v}")
    return " ".join(parts)


def resolve(names: list[str]) -> list[str]:
    """Probe addresses: IPv4 and IPv6 literals as they are, DNS names resolved now (before any
    change, while the resolver is reachable)."""
    out = []
    for name in names:
        try:
            out.append(str(ipaddress.ip_address(name)))
        except ValueError:
            try:
                out.append(socket.gethostbyname(name))
            except OSError as e:
                raise StateError([("--mgmt-probe", f"cannot resolve {name!r}: {e}")]) from None
    return out
