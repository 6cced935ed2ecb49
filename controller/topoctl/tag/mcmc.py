"""MCMC over TAG's space with the same simulator and budget: the search baseline.

FlexFlow (Jia et al., "Beyond Data and Model Parallelism for Deep Neural Networks", SysML
2019) searches parallelisation strategies by Metropolis-Hastings on simulated cost; TAG
compares against it. A state is a complete state of `topoctl.tag.space`; a proposal redraws
one group's decision uniformly among its legal actions and keeps every later decision that is
still legal (else the default, `space.complete`); it is accepted with probability
min(1, exp((v' - v) / temperature)) on the search's value (speed-up over the baseline - 1).
Deterministic for a seed; O(steps * groups) besides one value call per step. Returns the best
state seen.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

from topoctl.tag.space import Space, State, complete, legal


def repair(space: Space, prefix: State, rest: State) -> State:
    """`prefix` extended by `rest`'s decisions while they stay legal, then the default."""
    out = tuple(prefix)
    for a in rest:
        if a not in legal(space, out):
            break
        out += (a,)
    return complete(space, out)


def search(space: Space, value: Callable[[State], float], steps: int, seed: int = 0,
           temperature: float = 0.05, start: State | None = None,
           deadline: float | None = None, clock: Callable[[], float] = time.perf_counter,
           stop: Callable[[], bool] | None = None
           ) -> tuple[State, float, list[tuple[int, float]]]:
    """(best state, its value, improvements as (step, value)) after `steps` value calls, or
    fewer when `clock` passes `deadline` or `stop()` (a counted cap of the caller's) says so
    before a step (the last item of the improvements is then ``(-steps done, best value)``)."""
    rng = random.Random(seed)
    cur = start or complete(space, ())
    v = value(cur)
    best, best_v, hist = cur, v, [(0, v)]
    for step in range(1, steps):
        if (deadline is not None and clock() > deadline) or (stop is not None and stop()):
            hist.append((-step, best_v))
            break
        i = rng.randrange(space.groups)
        acts = legal(space, cur[:i])
        cand = repair(space, cur[:i] + (rng.choice(acts),), cur[i + 1:])
        w = value(cand)
        if w >= v or rng.random() < math.exp((w - v) / temperature):
            cur, v = cand, w
        if w > best_v:
            best, best_v = cand, w
            hist.append((step, w))
    return best, best_v, hist
