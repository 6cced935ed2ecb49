"""Every complete state of a TAG space: the exact optimum under the simulator on small cases.

Enumerates the search tree of `topoctl.tag.space` depth first (the same `legal` the search
uses) and values each complete state once per distinct canonical plan (`space.plan_of`): the
reference for the search's evaluation 3 (<= 4 hosts, <= 6 op-groups: within 2% of this
optimum). Exact by construction; O(leaves * (groups + one value call)), exponential in the
number of groups: for small cases only (`limit` stops it with ValueError).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from topoctl.tag.space import Space, State, legal, plan_of


def complete_states(space: Space, limit: int) -> Iterator[State]:
    """Every complete state of `space`, depth first in `legal`'s order (ValueError once more
    than `limit` have been reached). O(leaves * groups)."""
    stack: list[State] = [()]
    leaves = 0
    while stack:
        s = stack.pop()
        acts = legal(space, s)
        if not acts:
            leaves += 1
            if leaves > limit:
                raise ValueError(f"more than {limit} complete states")
            yield s
            continue
        stack += [s + (a,) for a in reversed(acts)]


def count(space: Space, limit: int = 1_000_000) -> int:
    """Number of complete states (ValueError beyond `limit`). O(leaves * groups)."""
    return sum(1 for _ in complete_states(space, limit))


def optimum(space: Space, value: Callable[[State], float], limit: int = 200_000
            ) -> tuple[State, float, int]:
    """(best complete state, its value, distinct plans valued) over every complete state;
    ties go to the first in depth-first order. ValueError beyond `limit` states."""
    best_s: State = ()
    best_v = -math.inf
    seen: dict = {}
    for s in complete_states(space, limit):
        key = plan_of(s)
        if key not in seen:
            seen[key] = value(s)
        if seen[key] > best_v:
            best_s, best_v = s, seen[key]
    return best_s, best_v, len(seen)
