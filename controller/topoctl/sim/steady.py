"""Steady-state period of a training iteration: several iterations back to back.

`simulate` runs one iteration from idle devices to the last task, as if every rank waited for
every other at its end. Training does not: a rank starts its next iteration as soon as its
own part is done. Where the parts end together (a ring AllReduce, a barrier) that changes
nothing; where they do not (a tree's root and shallow members leave its broadcast before the
deepest leaves; measured in the lab on tworack8: four of eight ranks left a tree
AllReduce 0.05-0.07 s before the last and ran most of their next forward and backward under
its tail), the next iteration's compute overlaps the previous one's communication, and the
period is shorter than one isolated iteration.

`steady_period` chains copies of the iteration's tasks: each device's first task (in list
order) and its tasks that wait for nothing, in copy ``i + 1``, also wait for that device's
last tasks (those nothing waits for) in copy ``i``; a transfer or collective that waits for
nothing waits for all of copy ``i``'s last tasks; a dependency on the previous iteration's
task (`tasks.previous`: cross-iteration overlap) makes copy ``i + 1`` wait for copy ``i``'s.
The period is the mean spacing of the copies' ends after the first. Cost: ``iterations``
times one `simulate` of the iteration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from topoctl.sim.engine import simulate
from topoctl.sim.network import Network
from topoctl.sim.tasks import PREVIOUS, Collective, Compute, Task, has_previous

__all__ = ["chain_iterations", "overlaps_iterations", "steady_period"]


def overlaps_iterations(tasks: Sequence[Task]) -> bool:
    """Whether the next iteration of `tasks` starts under this one's tail, so that its
    prediction is `steady_period`, not one isolated iteration: ranks leave a collective one
    by one (``Collective.member_done``), or a task waits for one of the previous iteration
    (`tasks.previous`, ``bucket_overlap: forward``). O(tasks)."""
    return has_previous(tasks) or any(isinstance(t, Collective) and t.member_done
                                      for t in tasks)


def _copy_id(i: int, tid: str) -> str:
    return f"it{i}:{tid}"


def chain_iterations(tasks: Sequence[Task], iterations: int) -> list[Task]:
    """`iterations` copies of `tasks` (ids prefixed ``it<i>:``), copy ``i + 1`` chained to copy
    ``i`` device by device as the module docstring says. Members' parts of a collective
    (``member_done``) keep their names under the prefix. O(iterations * tasks)."""
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    waited = {d for t in tasks for d in t.deps if not d.startswith(PREVIOUS)}
    last: dict[str, list[str]] = {}  # device -> its tasks nothing waits for
    ends = [t.id for t in tasks if t.id not in waited]  # every task nothing waits for
    first: set[str] = set()  # each device's first task
    seen: set[str] = set()
    for t in tasks:
        if isinstance(t, Compute):
            if t.id not in waited:
                last.setdefault(t.device, []).append(t.id)
            if t.device not in seen:
                seen.add(t.device)
                first.add(t.id)
    out: list[Task] = []
    for i in range(iterations):
        for t in tasks:
            own = [d for d in t.deps if not d.startswith(PREVIOUS)]
            deps = tuple(_copy_id(i, d) for d in own) + tuple(
                _copy_id(i - 1, d[len(PREVIOUS):]) for d in t.deps
                if i and d.startswith(PREVIOUS))
            if i and isinstance(t, Compute) and (t.id in first or not own):
                deps += tuple(_copy_id(i - 1, d) for d in last.get(t.device, ()))
            elif i and not own and not isinstance(t, Compute):
                deps = tuple(_copy_id(i - 1, d) for d in ends)
            out.append(replace(t, id=_copy_id(i, t.id), deps=deps))
    return out


def steady_period(tasks: Sequence[Task], network: Network, iterations: int = 3) -> float:
    """Seconds between the ends of consecutive iterations of `tasks` run back to back (mean
    over ``iterations - 1`` spacings; ``iterations == 1``: the isolated iteration's time).
    An iteration's end is its last task's (collectives: their last member's)."""
    res = simulate(chain_iterations(tasks, iterations), network, record=False)
    top = [t.id for t in tasks]
    ends = [max(res.finish[_copy_id(i, tid)] for tid in top) for i in range(iterations)]
    if iterations == 1:
        return ends[0]
    return (ends[-1] - ends[0]) / (iterations - 1)

