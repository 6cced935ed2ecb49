"""One time budget for the whole `tag` strategy: a deadline that interrupts a seed in flight.

TAG's seeds (the `trees` and `topoopt` plans it searches as data-parallel kinds, the `+sfb`
program's choice, the `placement` pipeline) are whole strategies whose cost grows with the
cluster (on 12 hosts `trees` alone plans and simulates for tens of seconds). The strategy gives
them a share of its budget and the search the rest (`topoctl.strategies.tag.run_search`);
`call_until` runs one seed and abandons it when the deadline passes.

How: in the main thread a one-shot real-time timer (`signal.setitimer`) raises `OutOfTime`
inside the seed at the deadline (between two bytecodes: C code finishes its call first); an
outer timer that fires earlier (pytest-timeout's, say) is left in charge, and one that fires
later is re-armed with what is left of it. Outside the main thread signals cannot be used: the
deadline is checked before the call only. A seed that raises leaves no partial result behind
(its caller stores results after the call). Deterministic whenever no deadline passes.
O(1) besides the call.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


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
