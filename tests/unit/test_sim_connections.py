"""One connection per peer for a process group's collectives (`topoctl.sim.connections`):
a small AllReduce issued after a big one of the same group queues behind it on the wire."""

from __future__ import annotations

import pytest

from topoctl.sim import Collective, Compute, ring_allreduce
from topoctl.sim.connections import GroupConnections, connection_steps
from topoctl.sim.engine import simulate
from topoctl.sim.network import star

BW = 1e6  # bytes/s per port
BIG, SMALL = 4e6, 1e3


def _two(group: str | None, hosts: list[str], small_after: float = 0.0) -> dict[str, float]:
    """Finish times of a big ring AllReduce issued at 0 and a small one issued `small_after`
    later (a compute task on a device of its own delays it), both of `group`."""
    tasks = [Compute("late", "clock", small_after),
             Collective("big", ring_allreduce(hosts, BIG), group=group),
             Collective("small", ring_allreduce(hosts, SMALL), ("late",), group=group)]
    return simulate(tasks, star(hosts, BW)).finish


def test_connection_steps_counts_steps_per_pair_in_first_use_order():
    steps = ring_allreduce(["a", "b", "c"], 3.0).steps
    counts = connection_steps((s.src, s.dst) for s in steps)
    assert counts == {("a", "c"): 4, ("b", "a"): 4, ("c", "b"): 4}
    assert list(counts) == [(s.src, s.dst) for s in steps[:3]]


def test_a_small_allreduce_of_the_group_finishes_after_the_big_one_issued_before_it():
    """Without a group the two share the ports fairly and the 1 KB one is done at once; in
    one group it waits for the 4 MB one on both connections (gloo's one pair per peer)."""
    hosts = ["a", "b"]
    alone = simulate([Collective("s", ring_allreduce(hosts, SMALL))], star(hosts, BW)).finish
    fair, fifo = _two(None, hosts, 0.1), _two("world", hosts, 0.1)
    assert fair["small"] <= 0.1 + 2 * alone["s"] + 1e-9  # side by side: half the rate
    assert fair["small"] < fair["big"]
    assert fifo["small"] > fifo["big"]  # queued behind the big one
    assert fifo["big"] == pytest.approx(BIG / BW)  # which the small one did not slow
    assert fifo["small"] == pytest.approx(BIG / BW + alone["s"])
    assert fair["small"] + fair["big"] < fifo["small"] + fifo["big"]


def test_issue_order_not_list_order_decides_who_goes_first():
    """The small one listed first but issued later still waits; issued first it goes first."""
    hosts = ["a", "b"]
    tasks = [Compute("late", "clock", 0.1),
             Collective("small", ring_allreduce(hosts, SMALL), ("late",), group="world"),
             Collective("big", ring_allreduce(hosts, BIG), group="world")]
    fin = simulate(tasks, star(hosts, BW)).finish
    assert fin["small"] > fin["big"]
    early = [Compute("late", "clock", 0.1),
             Collective("small", ring_allreduce(hosts, SMALL), group="world"),
             Collective("big", ring_allreduce(hosts, BIG), ("late",), group="world")]
    fin = simulate(early, star(hosts, BW)).finish
    assert fin["small"] < 0.1 < fin["big"]


def test_two_groups_do_not_queue_on_each_other():
    hosts = ["a", "b"]
    tasks = [Collective("big", ring_allreduce(hosts, BIG), group="g1"),
             Collective("small", ring_allreduce(hosts, SMALL), group="g2")]
    fin = simulate(tasks, star(hosts, BW)).finish
    assert fin["small"] < 0.01 * fin["big"]


def test_on_a_larger_ring_each_connection_serves_one_collective_at_a_time_in_issue_order():
    """Four members, three AllReduces of one group issued together: on every connection no
    step of a later collective starts before the last step of an earlier one there ended,
    the total is the sum of the three (the ports never carry two), and they end in order."""
    hosts = ["a", "b", "c", "d"]
    sizes = (2e6, 1e3, 1e6)
    tasks = [Collective(f"ar{k}", ring_allreduce(hosts, s), group="world")
             for k, s in enumerate(sizes)]
    res = simulate(tasks, star(hosts, BW), record=True)
    alone = [simulate([Collective("x", ring_allreduce(hosts, s))], star(hosts, BW))
             .iteration_time for s in sizes]
    assert res.iteration_time == pytest.approx(sum(alone))
    assert res.finish["ar0"] < res.finish["ar1"] < res.finish["ar2"]
    # per connection: (start, end) of each collective's steps there, in step order
    spans: dict[tuple[str, str], list[tuple[int, float, float]]] = {}
    for k, s in enumerate(sizes):
        steps = ring_allreduce(hosts, s).steps
        for i, st in enumerate(steps):
            end = res.finish[f"ar{k}/{i}"]
            spans.setdefault((st.src, st.dst), []).append((k, end - st.size * s / BW, end))
    for per in spans.values():
        for k in (1, 2):
            first = min(a for j, a, _ in per if j == k)
            assert first >= max(b for j, _, b in per if j == k - 1) - 1e-9


def test_group_connections_serve_the_head_then_the_next_in_issue_order():
    """The queue itself: the head's steps one at a time, then the next collective's."""
    conns = GroupConnections()
    conns.issue(10, "g", {("a", "b"): 2})
    conns.issue(20, "g", {("a", "b"): 1})
    conns.issue(10, "g", {("a", "b"): 2})  # again: nothing changes
    key = ("g", "a", "b")
    assert not conns.take(key, 20, 200)  # not the head: waits
    assert conns.take(key, 10, 100)
    assert not conns.take(key, 10, 101)  # the head's own next step waits for the first
    assert conns.release(key, 10) == 101
    assert conns.release(key, 10) == 200  # the head is done here: the next collective's step
    assert conns.release(key, 20) is None
    assert conns.conns == {}


def test_a_later_collective_uses_a_connection_the_earlier_one_has_left():
    """Ring a -> c -> b -> a with a's uplink 4x slower: the second AllReduce of the group
    sends on b's and c's connections while the first still sends on a's, which a chain
    (ar1 after all of ar0, the old one-stream model) forbids; the slow link decides the
    total either way."""
    from topoctl.sim.network import Link, Network, static_router

    hosts = ["a", "b", "c"]
    links = {}
    for h in hosts:
        links[f"{h}>sw"] = Link(f"{h}>sw", h, "sw", BW / 4 if h == "a" else BW, 0.0)
        links[f"sw>{h}"] = Link(f"sw>{h}", "sw", h, BW, 0.0)
    paths = {(s, d): [(1.0, (f"{s}>sw", f"sw>{d}"))] for s in hosts for d in hosts if s != d}
    net = Network(links, static_router(paths))
    fifo = simulate([Collective("ar0", ring_allreduce(hosts, 3e6), group="world"),
                     Collective("ar1", ring_allreduce(hosts, 3e6), group="world")], net)
    chain = simulate([Collective("ar0", ring_allreduce(hosts, 3e6)),
                      Collective("ar1", ring_allreduce(hosts, 3e6), ("ar0",))], net)
    early = [i for i in range(12) if fifo.finish[f"ar1/{i}"] < fifo.finish["ar0"]]
    assert early and not [i for i in range(12) if chain.finish[f"ar1/{i}"] < chain.finish["ar0"]]
    assert {s.src for i, s in enumerate(ring_allreduce(hosts, 3e6).steps) if i in early} \
        <= {"b", "c"}  # never on a's connection before ar0 is done there
    assert fifo.iteration_time == pytest.approx(chain.iteration_time)
