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


def subnet_map(new: dict, old: dict) -> dict[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """New subnet -> old subnet of the same cable/domain (`metadata.addressing.subnets`); empty
    when a cable of the new plan is not in the old one (nothing to keep then)."""
    a = ((new.get("metadata") or {}).get("addressing") or {}).get("subnets") or {}
    b = ((old.get("metadata") or {}).get("addressing") or {}).get("subnets") or {}
    if not a or any(k not in b for k in a):
        return {}
    out = {ipaddress.IPv4Network(a[k]): ipaddress.IPv4Network(b[k]) for k in a}
    if any(n.prefixlen != o.prefixlen for n, o in out.items()):
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
            ip = ipaddress.IPv4Address(addr)
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
    out["metadata"] = meta
    return out
