"""After TAG's tree: FlexFlow's Metropolis-Hastings walk on the same space and values.

The walk (`topoctl.tag.mcmc`; Jia et al., SysML 2019) starts from the baseline and reaches deep
pipelines of unequal replica sets (4-5 stages) the tree does not in the same number of playouts
(docs/results.md, TAG evaluation 1), the tree the plans a walk from the baseline does not; TAG
keeps the better of the two. Counted: as many steps as the tree's playouts, the search's seed,
and what the tree left of the simulations budget;
a wall clock only when the job set one (`Budget`). O(steps * groups) besides one value call per
step (most of them cached).
"""

from __future__ import annotations

import sys
import time

from topoctl.tag import mcmc, mcts
from topoctl.tag.budget import Budget
from topoctl.tag.evaluator import Evaluator, final_reserve, reward
from topoctl.tag.space import Space, State, plan_of


def walk(space: Space, ev: Evaluator, base: float, steps: int, seed: int, budget: Budget,
         res: mcts.SearchResult, tree_sims: int = 0) -> tuple[State, dict]:
    """The walk (module docstring) from the baseline, `steps` steps with `seed`, until the
    budget's simulations are spent (the tree simulated `tree_sims` of them) or its end less
    `final_reserve` when clocked; (the better of its best and the tree's
    best state, {"steps": done, "chosen": whether the walk's was better}). Deterministic for a
    seed when no clock cuts it (then `budget` records the cut)."""
    t0 = time.perf_counter()
    capped = budget.sims_stop(lambda: len(ev.cache), spent=tree_sims)  # the rest of the cap
    best, v, hist = mcmc.search(space, lambda s: reward(base, ev.time(plan_of(s))), steps,
                                seed=seed, deadline=budget.end(final_reserve(ev)),
                                stop=capped)
    stopped = hist[-1][0] < 0
    if stopped and not (capped is not None and capped()):  # the clock, not the count
        budget.note_cut("walk")
    done = -hist[-1][0] if stopped else steps
    better = v > res.best_value
    print(f"tag: walk (MCMC) {done} steps in {time.perf_counter() - t0:.1f} s, "
          f"{'better' if better else 'not better'} than the tree's best", file=sys.stderr,
          flush=True)
    return (best if better else res.best_state), {"steps": done, "chosen": better}
