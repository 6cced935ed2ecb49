"""Members' parts of a collective and the steady-state period of back-to-back iterations,
against closed forms on a line a -> b -> c."""

from __future__ import annotations

import pytest

from topoctl.sim import Collective, Compute, ring_allreduce, simulate
from topoctl.sim.engine import SimError
from topoctl.sim.network import star
from topoctl.sim.schedules import from_phases
from topoctl.sim.steady import chain_iterations, steady_period
from topoctl.sim.tasks import member_done

from .test_sim import line


def relay(member_parts: bool = True) -> Collective:
    """a -> b then b -> c, 100 bytes each (1 s each on `line(100)`): a leaves after 1 s."""
    return Collective("x", from_phases("relay", ("a", "b", "c"),
                                       [[("a", "b", 100.0)], [("b", "c", 100.0)]]),
                      ("w@a", "w@b", "w@c"), member_done=member_parts)


def iteration(work_a: float = 2.0, member_parts: bool = True) -> list:
    """Compute on a, b, c (a's `work_a`, the others 1 s), the relay, then each member's
    zero-length step after its own part of the relay (or after all of it)."""
    tasks = [Compute(f"w@{h}", h, work_a if h == "a" else 1.0) for h in "abc"]
    tasks.append(relay(member_parts))
    for h in "abc":
        after = member_done("x", h) if member_parts else "x"
        tasks.append(Compute(f"step@{h}", h, 0.0, (after,)))
    return tasks


def test_a_members_part_ends_with_its_last_step():
    r = simulate(iteration(1.0), line(100.0))
    assert r.finish[member_done("x", "a")] == pytest.approx(2.0)  # 1 s compute + its send
    assert r.finish[member_done("x", "b")] == pytest.approx(3.0)
    assert r.finish[member_done("x", "c")] == pytest.approx(3.0)
    assert r.finish["step@a"] == pytest.approx(2.0)
    assert r.finish["x"] == r.iteration_time == pytest.approx(3.0)


def test_members_parts_exist_only_when_asked_for_and_names_stay_unique():
    with pytest.raises(SimError, match="unknown task 'x@a'"):
        simulate(iteration(member_parts=False)[:4] + [Compute("s", "a", 0.0, ("x@a",))],
                 line(100.0))
    with pytest.raises(SimError, match="used twice"):
        simulate([Compute("x@a", "a", 1.0), relay()], line(100.0))


def test_steady_period_overlaps_the_next_compute_with_the_tail():
    """Alone: a's 2 s, the relay's 2 s: 4 s. Back to back a leaves the relay 1 s early and
    computes under its tail; b and c's 1 s fit after it: every 3 s."""
    tasks = iteration()
    assert simulate(tasks, line(100.0)).iteration_time == pytest.approx(4.0)
    assert steady_period(tasks, line(100.0), 3) == pytest.approx(3.0)
    assert steady_period(tasks, line(100.0), 1) == pytest.approx(4.0)


def test_steady_period_is_the_iteration_when_every_member_leaves_together():
    """A barrier (the whole collective) or a ring whose members end together: no overlap."""
    net = line(100.0)
    assert steady_period(iteration(member_parts=False), net, 4) == pytest.approx(
        simulate(iteration(member_parts=False), net).iteration_time)
    hosts = ["h0", "h1", "h2", "h3"]
    ring = [Compute(f"f@{h}", h, 0.5 + 0.1 * i) for i, h in enumerate(hosts)]
    ring.append(Collective("ar", ring_allreduce(hosts, 4e6), tuple(f"f@{h}" for h in hosts)))
    ring += [Compute(f"s@{h}", h, 0.01, ("ar",)) for h in hosts]
    net = star(hosts, 1e7)
    assert steady_period(ring, net, 3) == pytest.approx(simulate(ring, net).iteration_time)


def test_chain_iterations_ties_each_devices_first_task_to_its_last():
    out = {t.id: t for t in chain_iterations(iteration(), 2)}
    assert len(out) == 2 * len(iteration())
    assert out["it1:w@a"].deps == ("it0:step@a",)
    assert out["it1:x"].deps == ("it1:w@a", "it1:w@b", "it1:w@c")
    assert out["it1:step@b"].deps == ("it1:x@b",)
    with pytest.raises(ValueError, match="iterations"):
        chain_iterations(iteration(), 0)
