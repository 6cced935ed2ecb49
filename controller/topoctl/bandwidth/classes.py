"""An allocation as host configuration: per source host, per egress NIC, one QoS class per
destination (min = max = its allocated rate on that NIC), and for destinations split over
several first hops the weighted next hops of a policy-routing table. Pure; O(paths).

Rates go from the LP's goodput (bytes/s) to line rate (bit/s) by dividing by the TCP
efficiency, and are rounded down to whole kbit/s so a NIC's classes never sum above its rate."""

from __future__ import annotations

from dataclasses import dataclass

from topoctl.bandwidth.lp import Allocation
from topoctl.fabric.graph import FabricLink, lead_cable


@dataclass(frozen=True)
class ClassRow:
    """Host `src` sends to `dst` through its NIC `dev` (cable to `peer`) at `rate` bit/s."""

    src: str
    dst: str
    dev: str
    peer: str
    peer_nic: str | None
    rate: int


def class_rows(alloc: Allocation, bundles: dict[tuple[str, str], list[FabricLink]],
               efficiency: float, spread_bundles: bool = False) -> list[ClassRow]:
    """One row per (source, destination, egress NIC): the path rates leaving by that NIC (of
    a bundle of parallel cables, its `lead_cable`: the one the routes use; with
    `spread_bundles`, split in proportion to the cables' capacities)."""
    acc: dict[tuple, float] = {}
    for (s, d), lst in sorted(alloc.rates.items()):
        for path, r in lst:
            u, v = path[0].split(">", 1)
            cables = bundles[(u, v)] if spread_bundles else [lead_cable(bundles[(u, v)])]
            tot = sum(c.capacity for c in cables)
            for c in cables:
                dev, peer, pn = (c.a_nic, c.b, c.b_nic) if c.a == s else (c.b_nic, c.a, c.a_nic)
                key = (s, d, dev, peer, pn)
                acc[key] = acc.get(key, 0.0) + r * c.capacity / tot
    out = []
    for (s, d, dev, peer, pn), r in acc.items():
        bits = int(r * 8 / efficiency) // 1000 * 1000
        if bits >= 8000:
            out.append(ClassRow(s, d, dev, peer, pn, bits))
    return out


def multipath(rows: list[ClassRow]) -> dict[tuple[str, str], list[ClassRow]]:
    """(src, dst) -> its rows, for pairs that leave by more than one NIC."""
    by: dict[tuple[str, str], list[ClassRow]] = {}
    for r in rows:
        by.setdefault((r.src, r.dst), []).append(r)
    return {k: v for k, v in by.items() if len(v) > 1}
