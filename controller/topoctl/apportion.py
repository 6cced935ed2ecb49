"""Apportionment: an integer count (a batch's rows, samples) split over members in proportion
to their speeds. One function for every caller: data-parallel batch shares by host speed
(`strategies.shares`), a pipeline stage's rows over its replicas (`strategies.placement`, even
speeds) and TAG's stage shares by speed. Pure, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def apportion(total: int, speeds: Sequence[float]) -> list[int]:
    """`total` split over members in proportion to `speeds`: integers summing to `total`, each
    at least 1 (largest-remainder apportionment, Hamilton's method, in exact rational
    arithmetic; ties go to the lower member, so the result is deterministic). Every share is
    within one of its exact quota ``total * speed / sum(speeds)`` (the bound of the method)
    before the at-least-one rule, which takes from the largest share. Equal speeds give the
    even split, the first members one more. ValueError when `total` < members or a speed is
    not positive. O(n log n)."""
    if not speeds or any(s <= 0 for s in speeds):
        raise ValueError("speeds must be positive, one per member")
    if total < len(speeds):
        raise ValueError(f"{total} cannot give each of {len(speeds)} members one")
    exact = [Fraction(s) for s in speeds]
    whole = sum(exact)
    quota = [total * s / whole for s in exact]
    out = [int(q) for q in quota]  # floors (quotas are positive)
    order = sorted(range(len(quota)), key=lambda r: (-(quota[r] - out[r]), r))
    for r in order[: total - sum(out)]:
        out[r] += 1
    for r in range(len(out)):  # a very slow member still takes one: from the largest
        if out[r] == 0:
            big = max(range(len(out)), key=lambda i: (out[i], -i))
            out[big] -= 1
            out[r] = 1
    return out
