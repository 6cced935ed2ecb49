"""The ``tag`` strategy: TAG's search with the job's options, its plan as a Strategy.

`plan(ctx, kit)` is what the strategies registry runs for ``tag`` (registered by
`topoctl.strategies.tag`, which passes the `Kit` of the other strategies' functions). The job's
`tag` section: `playouts` and `simulations` (the counted budget of the tree and the walk),
`time_limit` (unset by default: no wall clock; set, the plan records what it cut), `seed`,
`prior`, `max_groups` (docs/tag.md). Progress goes to stderr.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from topoctl.tag.emit import adopt_placement, emit
from topoctl.tag.search import run_search

if TYPE_CHECKING:  # annotations only
    from topoctl.strategies import PlanContext, Strategy
    from topoctl.tag.kit import Kit
    from topoctl.tag.mcts import Progress


def stderr_progress(t0: float) -> Progress:
    """A search progress callback printing playouts, the best speed-up and seconds."""
    c0 = time.process_time()

    def show(done: int, total: int, best: float) -> None:
        print(f"tag: {done}/{total} playouts, best {best + 1:.3g}x the baseline, "
              f"{time.perf_counter() - t0:.1f} s (search CPU {time.process_time() - c0:.1f} s)",
              file=sys.stderr, flush=True)
    return show


def plan(ctx: PlanContext, kit: Kit) -> Strategy:
    """Strategy ``tag``: the search with the job's `tag` options (budget, seed, prior); the
    `placement` strategy's pipeline when it is faster (`emit.adopt_placement`)."""
    opts = ctx.job.tag
    t0, c0 = time.perf_counter(), time.process_time()
    net = None
    if opts.prior == "gnn":
        from topoctl.tag.prior import shipped  # lazily: torch
        net = shipped()
    out = run_search(ctx, kit, opts.playouts, opts.seed, opts.time_limit, net, opts.max_groups,
                     stderr_progress(t0), started=t0, with_placement=True,
                     simulations=opts.simulations)
    print(f"tag: {out.result.playouts} playouts, {len(out.evaluator.cache)} plans simulated "
          f"in {time.perf_counter() - t0:.1f} s (CPU {time.process_time() - c0:.1f} s)"
          + (f"; cut by the clock (tag.time_limit): {', '.join(out.cut)}" if out.cut else ""),
          file=sys.stderr, flush=True)
    other = adopt_placement(out)
    if other is not None:
        print(f"tag: the placement search's pipeline ({other.notes['tag']['adopted']}) is "
              "faster than the tree's best (or as fast on fewer hosts): adopted",
              file=sys.stderr, flush=True)
        return other
    return emit(ctx, out)
