"""Keep a re-planned plan's fabric addresses those of the plan it replaces.

The planner numbers cables in fabric order (`render/addressing.py`), so a plan made without one
cable shifts the subnet of every later cable. Applied to running hosts that would renumber
most ports at once, and while hosts apply in parallel a next hop's old address can answer a
probe on one host and be gone a moment later (the agent then reverts). A heal should change
only what the lost cable forces, so every subnet of the new plan is mapped back to the subnet
the same cable (or L2 domain) had in the old plan, offsets kept. Pure; O(size of the plan)."""

from __future__ import annotations

import ipaddress
from typing import Any

Net = ipaddress.IPv4Network | ipaddress.IPv6Network


def _subnets(plan: dict) -> list[dict]:
    """The plan's subnets per family: `metadata.addressing.subnets`, and a dual plan's IPv4
    ones (`metadata.addressing.ipv4.subnets`)."""
    a = (plan.get("metadata") or {}).get("addressing") or {}
    return [a.get("subnets") or {}, (a.get("ipv4") or {}).get("subnets") or {}]


def subnet_map(new: dict, old: dict) -> dict[Net, Net]:
    """New subnet -> old subnet of the same cable/domain (`metadata.addressing.subnets`, each
    family's); empty when a cable of the new plan is not in the old one (nothing to keep
    then)."""
    out: dict[Net, Net] = {}
    for a, b in zip(_subnets(new), _subnets(old), strict=True):
        if any(k not in b for k in a):
            return {}
        out |= {ipaddress.ip_network(a[k]): ipaddress.ip_network(b[k]) for k in a}
    if any(n.prefixlen != o.prefixlen or n.version != o.version for n, o in out.items()):
        return {}
    return out


def keep_addresses(new: dict, old: dict) -> dict:
    """`new` with every fabric address moved to the subnet its cable had in `old` (a new dict);
    `new` itself when the two plans' cables do not correspond."""
    nets = subnet_map(new, old)
    if not nets or all(n == o for n, o in nets.items()):
        return new

    def move(text: str) -> str:
        addr, slash, plen = text.partition("/")
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            return text
        for n, o in nets.items():
            if ip in n and (not slash or plen == str(n.prefixlen)):
                moved = o.network_address + (int(ip) - int(n.network_address))
                return f"{moved}{slash}{plen}"
        return text

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return move(v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    # only what hosts enforce and the plan's own record of it: nothing else holds fabric
    # addresses (training /32s live in their own pool and are unchanged)
    out = dict(new)
    out["hosts"] = walk(new["hosts"])
    meta = dict(new["metadata"])
    meta["addressing"] = meta["addressing"] | {"subnets": walk(meta["addressing"]["subnets"])}
    if "ipv4" in meta["addressing"]:  # a dual plan's IPv4 record
        v4 = meta["addressing"]["ipv4"]
        meta["addressing"]["ipv4"] = v4 | {"subnets": walk(v4["subnets"])}
    out["metadata"] = meta
    return out
