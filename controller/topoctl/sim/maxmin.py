"""Max-min fair bandwidth allocation by progressive filling (water-filling).

Bertsekas & Gallager, *Data Networks* (2nd ed.), section 6.5.2: raise all unfrozen flows' rates
together until some link saturates; freeze the flows through saturated links; repeat. The
result is the unique max-min fair allocation: no flow can get more without taking from a flow
that has no more. Each round saturates at least one link, so there are at most L rounds of
O(L + sum of path lengths) work: O(L * (L + P)) worst case, one round in the common case where
all flows share one bottleneck level (ring steps).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence


def maxmin_rates(flows: Mapping[Hashable, Sequence[Hashable]],
                 capacity: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Rates for `flows` (flow id -> the links it crosses) under link `capacity` (same unit as
    the rates). A flow that crosses no link gets `math.inf`. Links may repeat in a path (a
    flow crossing a link twice uses it twice)."""
    rate: dict[Hashable, float] = {}
    users: dict[Hashable, list[Hashable]] = {}
    for f, links in flows.items():
        if not links:
            rate[f] = math.inf
            continue
        for ln in links:
            u = users.get(ln)
            if u is None:
                users[ln] = [f]
            else:
                u.append(f)
    count = {ln: len(u) for ln, u in users.items()}
    if len(count) == sum(count.values()):  # no link shared: each flow gets its bottleneck
        for f, links in flows.items():
            if links:
                rate[f] = min(capacity[ln] for ln in links)
        return rate
    left = {ln: float(capacity[ln]) for ln in users}
    level = 0.0  # the common rate of all flows not yet frozen
    while count:
        inc = min(left[ln] / c for ln, c in count.items())
        level += inc
        saturated = []
        for ln, c in count.items():
            rem = left[ln] - inc * c
            left[ln] = rem
            if rem <= 1e-9 * capacity[ln]:
                saturated.append(ln)
        for ln in saturated:
            for f in users[ln]:
                if f not in rate:
                    rate[f] = level
                    for other in flows[f]:
                        count[other] -= 1
        for ln in [ln for ln, c in count.items() if c <= 0]:
            del count[ln]
    return rate
