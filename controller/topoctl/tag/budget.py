"""TAG's one budget: counts decide the plan; a wall clock only when the job asks for one.

By default (`job.tag.time_limit` unset) everything is counted, so the same input gives the same
plan bytes on a quiet machine and a loaded one (`topoctl.limits`, docs/architecture.md rule
5): the seeds (the other strategies' plans TAG starts from) run to completion, the tree search
runs `playouts` playouts and the walk after it as many steps, and the two together simulate
at most `simulations` distinct plans (a simulation is the search's unit of cost: on 12 hosts
one costs 100x what it does on 4, so a playout count alone does not bound the time). The tree
stops at `TREE_SHARE` of `simulations`, the walk gets the rest (and what the tree left).

With `time_limit` seconds the whole strategy is also cut by the clock: a seed still running at
the deadline is abandoned (`call_until`), the search and the walk stop early, the planner's
own simulation of the chosen plan is left room (`reserve`). Whatever the clock cut is recorded
(`Budget.cut`) and the plan says so (`report`: `cut_short` in its metadata, a line in
`topoctl explain`): that plan may differ from run to run.

How a seed is cut: in the main thread a one-shot real-time timer (`signal.setitimer`) raises
`OutOfTime` inside the seed at the deadline (between two bytecodes: C code finishes its call
first); an outer timer that fires earlier (pytest-timeout's, say) is left in charge, and one
that fires later is re-armed with what is left of it. Outside the main thread signals cannot be
used: the deadline is checked before the call only. A seed that raises leaves no partial result
behind (its caller stores results after the call). O(1) besides the call.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

TREE_SHARE = 0.75  # of the simulations budget, the most the tree may use; the walk: the rest


class OutOfTime(Exception):
    """The deadline passed before (or while) a budgeted call ran."""


def _alarm(signum: int, frame: object) -> None:
    raise OutOfTime("the tag strategy's time budget ran out")


def call_until(fn: Callable[[], T], deadline: float | None,
               clock: Callable[[], float] = time.perf_counter) -> T:
    """fn(), or OutOfTime when `clock` is past `deadline` (a `clock` reading; None: no limit)
    before or during the call (module docstring)."""
    if deadline is None:
        return fn()
    left = deadline - clock()
    if left <= 0:
        raise OutOfTime("the tag strategy's time budget ran out")
    if threading.current_thread() is not threading.main_thread():
        return fn()
    outer, _ = signal.getitimer(signal.ITIMER_REAL)
    if outer and outer <= left:  # an earlier timer governs; ours would come after it
        return fn()
    t0 = clock()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer - (clock() - t0)))


@dataclass
class Budget:
    """The strategy's budget (module docstring): `playouts` of the tree search (and steps of
    the walk after it); `simulations`: distinct plans the tree and the walk may simulate
    together (None: no cap); `seconds`: the job's `tag.time_limit` from `start` (None:
    counted only, the default); `seed_share`: the fraction of `seconds` the seeds may use
    (1.0: all of it; they are TAG's floor, "never slower than the best other strategy", so
    they are not cut earlier by default); `cut`: what the clock cut short, in order."""

    playouts: int
    simulations: int | None = None
    seconds: float | None = None
    seed_share: float = 1.0
    start: float = field(default_factory=time.perf_counter)
    cut: list[str] = field(default_factory=list)

    @property
    def clocked(self) -> bool:
        """Whether a wall clock limits this search at all."""
        return self.seconds is not None

    def seeds_end(self) -> float | None:
        """The `time.perf_counter()` reading the seeds must finish by (None: no limit)."""
        return None if self.seconds is None else self.start + self.seed_share * self.seconds

    def left(self, reserve: float = 0.0) -> float | None:
        """Seconds left for the search less `reserve` (>= 0; None: no limit)."""
        if self.seconds is None:
            return None
        return max(0.0, self.start + self.seconds - time.perf_counter() - reserve)

    def end(self, reserve: float = 0.0) -> float | None:
        """The reading the search must stop at, `reserve` seconds early (None: no limit)."""
        return None if self.seconds is None else self.start + self.seconds - reserve

    def sims_stop(self, simulated: Callable[[], int], share: float = 1.0, spent: int = 0
                  ) -> Callable[[], bool] | None:
        """A `stop` for the tree or the walk: True once `simulated()` (distinct plans valued
        so far) has grown from now by `share` of `simulations` less the `spent` ones (None:
        no cap)."""
        if self.simulations is None:
            return None
        cap = simulated() + int(share * self.simulations) - spent
        return lambda: simulated() >= cap

    def note_cut(self, step: str) -> None:
        """Record that the clock cut `step` short (each step once)."""
        if step not in self.cut:
            self.cut.append(step)

    def seed(self, name: str, fn: Callable[[], T], until: float | None = None) -> T | None:
        """fn() within the seeds' share (or until `until`); None, and `name` recorded as cut,
        when the clock ran out. Counted budgets run it to completion."""
        t0, c0 = time.perf_counter(), time.process_time()

        def took() -> str:  # wall and CPU: on a loaded machine only the CPU says the cost
            return (f"{time.perf_counter() - t0:.1f} s (CPU {time.process_time() - c0:.1f} s)")
        try:
            out = call_until(fn, self.seeds_end() if until is None else until)
        except OutOfTime:
            self.note_cut(f"seed {name}")
            print(f"tag: seed {name}: out of time after {took()}", file=sys.stderr, flush=True)
            return None
        print(f"tag: seed {name}: {took()}", file=sys.stderr, flush=True)
        return out

    def report(self) -> dict:
        """What the plan's metadata says of the budget: the counts, and with a wall clock its
        seconds and (when it cut in) `cut_short` with a note, as `topoctl.limits` does."""
        out: dict = {"playouts_budget": self.playouts,
                     **({"simulations_budget": self.simulations}
                        if self.simulations is not None else {})}
        if self.seconds is None:
            return out
        out["time_limit"] = self.seconds
        if self.cut:
            out["cut_short"] = list(self.cut)
            out["cut_short_note"] = (f"job.tag.time_limit ({self.seconds:g} s) cut the search: "
                                     "this plan may differ from run to run")
        return out
