"""TAG's rollout policy for a staged node: the completions that give the rest to one more stage.

A partial pipeline is valued by what it can become, not only by running the rest of the model
on its current stage (the search's default completion): `lookahead` lists a few completions
with one more stage, on the free host sets where the remaining groups run fastest, cut where
the two stages' compute balance. Pure over plain data (the space, a state, seconds per group
per host); the value is the best of these and the default.
"""

from __future__ import annotations

from topoctl.tag.space import Space, State, host_sets, used_hosts

LOOKAHEAD = 3  # next-stage host sets a staged node's value tries besides the default
CUT_WINDOW = 3  # cuts tried on the best set: the compute-balanced one and 3 either side


def _pace(times: list[list[float]], hs: list[int], a: int, b: int, wide: bool) -> float:
    """Seconds of groups [a, b) on host indices `hs`: a stage runs at its slowest member's
    pace, its replicas splitting the rows (equal counts: the same divisor everywhere)."""
    div = len(hs) if wide else 1
    return sum(max(times[j][h] for h in hs) for j in range(a, b)) / div


def _tries(space: Space, free: list[str], cur: list[int], i: int,
           times: list[list[float]]) -> list[tuple[list[int], bool]]:
    """(host indices of the next stage, try a window of cuts?) in the order `lookahead` tries
    them: the `LOOKAHEAD` fastest free sets of the current stage's size (the window on the
    first), then the fastest set of each other size in a space of unequal counts."""
    n, wide = space.groups, not space.equal_replicas

    def ranked(size: int) -> list[list[int]]:
        sets = [[space.hosts.index(h) for h in s] for s in host_sets(space, free, size)]
        return sorted(sets, key=lambda hs: (_pace(times, hs, i, n, wide), hs))

    tries = [(hs, r == 0) for r, hs in enumerate(ranked(len(cur))[:LOOKAHEAD])]
    if wide:
        tries += [(s[0], False) for g in space.sizes if g != len(cur) and (s := ranked(g))]
    return tries


def lookahead(space: Space, state: State, times: list[list[float]]) -> list[State]:
    """Completions of a staged `state` that give the rest of the model to one more stage:
    on the free host set where the remaining groups run fastest, the cut where the current
    stage's and the new stage's compute balance and `CUT_WINDOW` cuts either side of it (the
    activations a cut sends are left to the simulator); on the next `LOOKAHEAD` - 1 sets, the
    balanced cut. Sets of the stage's replica count; in a space of unequal counts
    (`Space.equal_replicas` False) also the fastest set of each other count, balanced cut.
    O((LOOKAHEAD + sizes) * groups) completions, most of them shared with the node's
    neighbours (the evaluator caches per plan)."""
    i, n = len(state), space.groups
    if not state or state[0][0] != "stage" or i >= n:
        return []
    first = max(k for k, a in enumerate(state) if a[0] == "stage")
    cur = [space.hosts.index(h) for h in state[first][1]]
    free = [h for h in space.hosts if h not in used_hosts(state)]
    wide = not space.equal_replicas
    out = []
    for hs, window in _tries(space, free, cur, i, times):
        bal = min(range(i, n), key=lambda c: (max(_pace(times, cur, first, c, wide),
                                                   _pace(times, hs, c, n, wide)), c))
        cuts = range(max(i, bal - CUT_WINDOW), min(n, bal + CUT_WINDOW + 1)) if window else [bal]
        new = ("stage", tuple(space.hosts[h] for h in hs), "none" if len(hs) == 1 else "ring")
        out += [state + (("same",),) * (k - i) + (new,) + (("same",),) * (n - k - 1)
                for k in cuts]
    return out
