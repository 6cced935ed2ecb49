"""Management-connection guard: a plan must not cut off the operator who applies it.

The connection the agent was reached over is known from SSH_CONNECTION ("client_ip client_port
server_ip server_port", set by sshd) or given explicitly (--mgmt CLIENT_IP,SERVER_IP). An
operation that would remove the server address, take down or re-MTU its link, or change the
route the host uses to reach the client is refused unless the operator forces it.

That static guard sees operations one by one. After an apply, the agent also asks the kernel
(`ip route get`) for the path to the client and to every configured probe address
(`--mgmt-probe`: a gateway, the controller, a DNS name) and compares it with the path before:
a rule that diverts everything to another table, a blackhole, an MTU or link-state change of the
outgoing link all show up there; a changed path reverts the apply."""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass

from topoagent.apply.kernel_ops import DelAddress, DelRoute, Op, SetLink, SetRoute
from topoagent.observe.host import Observed
from topoagent.state.host import StateError


@dataclass(frozen=True)
class Mgmt:
    """The management connection: the operator's address and the host address it connected to."""

    client: str  # the operator's address, as the host sees it
    server: str  # the host's address the operator connected to

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
            return cls(str(ipaddress.IPv4Address(client)), str(ipaddress.IPv4Address(server)))
        except ValueError:
            raise StateError([("--mgmt", f"expected CLIENT_IP,SERVER_IP, got {text!r}")]) from None


def _main_route_to(obs: Observed, ip: str) -> tuple | None:
    """Key of the main-table route the kernel would pick for `ip` (longest prefix, then metric)."""
    addr = ipaddress.IPv4Address(ip)
    best = None
    for key in obs.routes:
        table, dst, metric = key
        net = ipaddress.IPv4Network(dst)
        if table == 254 and addr in net:
            rank = (net.prefixlen, -metric)
            if best is None or rank > best[0]:
                best = (rank, key)
    return best[1] if best else None


def guard(ops: list[Op], obs: Observed, mgmt: Mgmt) -> None:
    """Raise StateError naming each operation that touches the management connection.

    The connection, not every address sharing its IP: deleting one of two addresses with the
    server's IP (say the agent's own /32 beside the foreign management /24) is no hit while
    the other stays; the link is the one the route to the client leaves by."""
    holders = [(d, a) for d, addrs in obs.addresses.items() for a in addrs
               if a.split("/")[0] == mgmt.server]
    route_key = _main_route_to(obs, mgmt.client)
    route_dev = obs.routes[route_key].route.dev if route_key is not None else None
    dev = route_dev if route_dev in {d for d, _ in holders} else (
        holders[0][0] if holders else None)
    deleted = {(op.dev, op.address) for op in ops if isinstance(op, DelAddress)}
    server_stays = any(h not in deleted for h in holders)
    client = ipaddress.IPv4Address(mgmt.client)
    problems = []
    for op in ops:
        hit = (
            (isinstance(op, DelAddress) and op.address.split("/")[0] == mgmt.server
             and not server_stays)
            or (isinstance(op, SetLink) and op.dev == dev)
            or (isinstance(op, DelRoute) and op.route.key == route_key)
            or (isinstance(op, SetRoute) and op.route.table == 254
                and client in ipaddress.IPv4Network(op.route.dst)
                and (route_key is None
                     or ipaddress.IPv4Network(op.route.dst).prefixlen
                     >= ipaddress.IPv4Network(route_key[1]).prefixlen))
        )
        if hit:
            problems.append(("", f"refusing to {op.describe()}: it carries the management "
                             f"connection {mgmt.client} -> {mgmt.server} (dev {dev}); "
                             f"use --force-mgmt to do it anyway"))
    if problems:
        raise StateError(problems)


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
    """Probe addresses: IPv4 literals as they are, DNS names resolved now (before any change,
    while the resolver is reachable)."""
    out = []
    for name in names:
        try:
            out.append(str(ipaddress.IPv4Address(name)))
        except ValueError:
            try:
                out.append(socket.gethostbyname(name))
            except OSError as e:
                raise StateError([("--mgmt-probe", f"cannot resolve {name!r}: {e}")]) from None
    return out
