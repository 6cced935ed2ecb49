"""The simulator charges a collective runtime's CPU per message on a CPU pool
(`topoctl.sim.network.CpuPool.messages`, issue 35): the per-message time (a ring's
latency, which the lab's cables do not have) and the CPU the bytes take from the compute the
communication overlaps; the planner prices it from the machine's calibration and every
data-parallel ring strategy pays it; DisCo's search no longer has a cost of its own."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from topoctl.collective.trees.pipeline import RuntimeCosts
from topoctl.labprofile import DEFAULT_LAB
from topoctl.placement.runtime import allreduce_cpu, message_cost, message_cpu
from topoctl.planner import lab_messages
from topoctl.sim import Collective, Compute
from topoctl.sim.engine import simulate
from topoctl.sim.network import CpuPool, MessageCost, star
from topoctl.sim.schedules import ring_allreduce
from topoctl.strategies.sfb import ring_rates

MSG = message_cost(RuntimeCosts(), DEFAULT_LAB)  # the defaults' gloo message in the lab
B = 100e6  # bytes/s per port


def _net(messages: MessageCost | None = MSG, hosts=("a", "b"), cores: int = 2, cap=B):
    net = star(list(hosts), cap)
    net.cpu_pool = CpuPool(frozenset(hosts), cores, messages)
    return net


def test_message_cost_is_the_calibrated_message_cpu():
    costs = RuntimeCosts()
    for lab in (None, DEFAULT_LAB):
        m = message_cost(costs, lab, 42e-6)
        for n in (0.0, 1e3, 4e6):
            assert m.seconds(n) == pytest.approx(message_cpu(n, costs, lab, 42e-6))
    # in the lab a byte also costs the cable emulation: the slower of the two rates
    assert MSG.bytes_per_s == DEFAULT_LAB.wire_rate(costs.wire_bytes_per_s) < \
        costs.wire_bytes_per_s
    assert MSG.per_message_s == costs.per_message_s


def test_small_allreduce_costs_twice_the_message_time_per_round():
    """Two ranks, 4 bytes: 2(n-1) = 2 rounds, each rank sending one message and receiving one
    per round on its one communication thread: 4 per-message times (what DisCo's
    `bucket_overhead` charged per bucket before it moved here)."""
    t = simulate([Collective("ar", ring_allreduce(["a", "b"], 4.0))], _net()).iteration_time
    assert t == pytest.approx(4 * MSG.per_message_s + 2 * 2.0 / B, rel=1e-3)
    three = simulate([Collective("ar", ring_allreduce(["a", "b", "c"], 6.0))],
                     _net(hosts=("a", "b", "c"), cores=8)).iteration_time
    assert three == pytest.approx(2 * 2 * 2 * MSG.per_message_s, rel=1e-2)


def test_without_messages_or_pool_nothing_changes():
    tasks = [Collective("ar", ring_allreduce(["a", "b"], 2e6))]
    bare = star(["a", "b"], B)
    t0 = simulate(tasks, bare).iteration_time
    assert t0 == pytest.approx(2 * 1e6 / B)
    assert simulate(tasks, _net(None)).iteration_time == t0  # a pool that prices nothing
    pair = replace(bare, cpu_pool=(frozenset("ab"), 2))  # a plain (devices, cores) pair
    assert simulate(tasks, pair).iteration_time == t0
    # a collective whose runtime's CPU the strategy models itself (the tree runtime's)
    own = [Collective("ar", ring_allreduce(["a", "b"], 2e6), own_cpu=True)]
    assert simulate(own, _net()).iteration_time == t0


def test_large_allreduce_pays_the_message_time_on_top_of_its_bytes():
    """Link-bound (the CPU per byte is below the wire time): per round the per-message time
    and then the bytes, so the fitted ring has a latency of 4 messages for two ranks."""
    net = _net()
    (alpha, beta), _ = ring_rates(["a", "b"], net)
    assert alpha == pytest.approx(4 * MSG.per_message_s, rel=1e-6)
    assert beta == pytest.approx(1 / B, rel=1e-6)
    (alpha0, _), _ = ring_rates(["a", "b"], star(["a", "b"], B))
    assert alpha0 == pytest.approx(0.0, abs=1e-12)  # the lab's network alone: none


def test_overlapped_communication_takes_cpu_from_the_compute():
    """Two ranks computing on two cores while they all-reduce: the cores are busy all along,
    so the compute ends later by exactly the CPU the AllReduce's messages took, half each
    (4 messages per rank: 2 rounds x (send + receive), each `message_cpu` of half the
    bytes), the calibrated figure `placement.runtime.allreduce_cpu` charges less its
    reduce adds and copies."""
    size, work = 4e6, 1.0
    tasks = [Compute("c@a", "a", work), Compute("c@b", "b", work),
             Collective("ar", ring_allreduce(["a", "b"], size))]
    res = simulate(tasks, _net())
    per_rank = 4 * MSG.seconds(size / 2)
    assert res.finish["c@a"] == pytest.approx(work + per_rank, rel=1e-6)
    assert res.finish["c@b"] == pytest.approx(work + per_rank, rel=1e-6)
    costs = RuntimeCosts()
    extra = allreduce_cpu(size, 2, costs, DEFAULT_LAB) - per_rank
    assert extra == pytest.approx(0.5 * size / costs.reduce_bytes_per_s
                                  + 2 * size / costs.copy_bytes_per_s)
    # unpooled or on more cores than work: the compute is not slowed
    assert simulate(tasks, _net(None)).finish["c@a"] == pytest.approx(work)
    assert simulate(tasks, _net(cores=4)).finish["c@a"] == pytest.approx(work)


def test_quota_bounds_the_communication_thread_too():
    """A host with a CPU quota (`Network.speed` on a pool) runs its messages within it."""
    net = _net()
    net.speed = {"a": 0.25, "b": 0.25}
    t = simulate([Collective("ar", ring_allreduce(["a", "b"], 4.0))], net).iteration_time
    assert t == pytest.approx(4 * MSG.per_message_s / 0.25, rel=1e-3)


def test_the_planner_prices_lab_messages_from_the_calibration():
    """Without the machine's caches the defaults (plans that do not depend on the machine);
    the pool the planner gives lab ranks carries them (`planner._on_lab_cpu`)."""
    ctx = SimpleNamespace(use_cache=False, world_size=2, lab=DEFAULT_LAB)
    assert lab_messages(ctx, None) == MSG
    assert lab_messages(SimpleNamespace(use_cache=False, world_size=8, lab=DEFAULT_LAB),
                        None) == MSG
