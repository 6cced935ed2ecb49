"""Management-connection guard: a plan must not cut off the operator who applies it.

The connection the agent was reached over is known from SSH_CONNECTION ("client_ip client_port
server_ip server_port", set by sshd) or given explicitly (--mgmt CLIENT_IP,SERVER_IP). An
operation that would remove the server address, take down or re-MTU its link, or change the
route the host uses to reach the client is refused unless the operator forces it."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from topoagent.kernel_ops import DelAddress, DelRoute, Op, SetLink, SetRoute
from topoagent.observe import Observed
from topoagent.state import StateError


@dataclass(frozen=True)
class Mgmt:
    client: str  # the operator's address, as the host sees it
    server: str  # the host's address the operator connected to

    @classmethod
    def from_env(cls) -> Mgmt | None:
        parts = os.environ.get("SSH_CONNECTION", "").split()
        return cls(client=parts[0], server=parts[2]) if len(parts) == 4 else None

    @classmethod
    def parse(cls, text: str) -> Mgmt:
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
    """Raise StateError naming each operation that touches the management connection."""
    dev = next((d for d, addrs in obs.addresses.items()
                for a in addrs if a.split("/")[0] == mgmt.server), None)
    route_key = _main_route_to(obs, mgmt.client)
    client = ipaddress.IPv4Address(mgmt.client)
    problems = []
    for op in ops:
        hit = (
            (isinstance(op, DelAddress) and op.address.split("/")[0] == mgmt.server)
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
