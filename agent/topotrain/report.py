"""Reporting a training script's progress to `topoctl run` (optional).

`topoctl run` supervises any command by its exit status; a script that also reports its
iterations gets the live progress line, the median iteration against the plan's prediction,
and (with `done(model)`) the check that every rank ended with the same parameters:

    from topotrain import report
    for batch in loader:
        t0 = time.perf_counter()
        ...                                   # forward, backward, step
        report.iteration(time.perf_counter() - t0)
    report.done(model)

The events (the contract, docs/own-script.md), one JSON object a line on the pipe
$TOPOCTL_EVENT_FD that `topo-agent launch` gives each rank:

    {"event": "iter", "rank": R, "iter": I, "seconds": S}
    {"event": "done", "rank": R, "checksum": "<sha256 of the parameters>" | null}

Run outside `topoctl run` (no $TOPOCTL_EVENT_FD) these calls do nothing.
"""

from __future__ import annotations

import os

from topotrain.events import EVENT_FD_ENV, emit

__all__ = ["done", "iteration"]

_iterations = 0


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def iteration(seconds: float) -> None:
    """One finished iteration of this rank that took `seconds`."""
    global _iterations
    if EVENT_FD_ENV not in os.environ:
        return
    _iterations += 1
    emit(event="iter", rank=_rank(), iter=_iterations, seconds=float(seconds))


def done(model=None) -> None:
    """This rank finished; with `model` (an nn.Module, DDP-wrapped or not) the checksum of its
    parameters, which `topoctl run` compares across ranks."""
    if EVENT_FD_ENV not in os.environ:
        return
    from topotrain.workload import checksum  # torch: only for a script that reports one

    emit(event="done", rank=_rank(), checksum=None if model is None else checksum(model))
