"""Crowded cores (`topoctl.sim.network.CpuPool.crowding`, issue 33): while more of a CPU
pool's flows run than it has cores, a model compute task gets through its CPU-seconds
`crowded_cost` times slower (time-slicing: its caches refilled after the others ran); the
runtimes' own CPU (``Compute.communication``: the tree runtime's, gloo's messages) is
calibrated on the shared cores and is not slowed; a pool without crowding is processor
sharing as before."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from topoctl.pipeline.gpipe import stage_crowding
from topoctl.sim import Compute
from topoctl.sim.engine import simulate
from topoctl.sim.network import CpuPool, crowded_cost, star

HOSTS = ("a", "b", "c", "d")


def _net(cores: int, crowding: float, hosts=HOSTS):
    net = star(list(hosts), 1e9)
    net.cpu_pool = CpuPool(frozenset(hosts), cores, None, crowding)
    return net


def test_crowded_cost_is_linear_in_the_oversubscription():
    assert crowded_cost(0.1, 2, 2) == 1.0  # as many flows as cores: no time-slicing
    assert crowded_cost(0.1, 1, 2) == 1.0
    assert crowded_cost(0.1, 4, 2) == pytest.approx(1.1)
    assert crowded_cost(0.1, 6, 2) == pytest.approx(1.2)
    assert crowded_cost(0.0, 6, 2) == 1.0
    assert crowded_cost(-1.0, 6, 2) == 1.0  # a calibration below zero is none


def test_ranks_on_fewer_cores_take_longer_by_the_crowded_cost():
    """Four ranks of 10 ms each: on four cores 10 ms; on two cores processor sharing alone
    gives 20 ms, and crowding 0.25 stretches it by crowded_cost(0.25, 4, 2) = 1.25."""
    tasks = [Compute(f"f{h}", h, 0.010) for h in HOSTS]
    assert simulate(tasks, _net(4, 0.25)).iteration_time == pytest.approx(0.010)
    assert simulate(tasks, _net(2, 0.0)).iteration_time == pytest.approx(0.020)
    assert simulate(tasks, _net(2, 0.25)).iteration_time == pytest.approx(0.025)


def test_the_slowdown_ends_when_the_crowd_does():
    """Three ranks on two cores, two of 10 ms and one of 30 ms, crowding 0.5: while three run
    (1.5 flows per core, cost 1.25) each gets 2/3 of a core and does 2/3 / 1.25 of its work per
    second; the short ones end at 0.010 * 1.25 * 1.5 = 18.75 ms, when the long one has 10 ms
    of its work done; alone on a core it does the last 20 ms at full speed: 38.75 ms."""
    hosts = ("a", "b", "c")
    tasks = [Compute("fa", "a", 0.010), Compute("fb", "b", 0.010), Compute("fc", "c", 0.030)]
    res = simulate(tasks, _net(2, 0.5, hosts))
    assert res.finish["fa"] == pytest.approx(0.01875)
    assert res.iteration_time == pytest.approx(0.01875 + 0.020)


def test_the_runtimes_own_cpu_is_not_slowed_but_takes_its_share():
    """Two model tasks and two of a runtime's CPU (`communication`) on two cores, crowding
    1.0 (cost 2 with four flows): every flow gets half a core; the runtime's 10 ms end at
    20 ms, the model's 10 ms then have 5 ms done and finish alone on a core each: 25 ms."""
    tasks = [Compute("fa", "a", 0.010), Compute("fb", "b", 0.010),
             Compute("ca", "c", 0.010, communication=True),
             Compute("cb", "d", 0.010, communication=True)]
    res = simulate(tasks, _net(2, 1.0))
    assert res.finish["ca"] == pytest.approx(0.020)
    assert res.iteration_time == pytest.approx(0.025)
    plain = simulate(tasks, _net(2, 0.0))
    assert plain.iteration_time == pytest.approx(0.020)


def test_a_pool_without_crowding_is_unchanged():
    tasks = [Compute(f"f{h}", h, 0.010 * (i + 1)) for i, h in enumerate(HOSTS)]
    old = replace(star(list(HOSTS), 1e9), cpu_pool=(frozenset(HOSTS), 2))  # a plain pair
    assert simulate(tasks, _net(2, 0.0)).iteration_time == \
        simulate(tasks, old).iteration_time


def test_the_crowding_is_timed_at_three_times_the_cores_and_scaled_to_the_oversubscription():
    """8 lab ranks on 2 cores: the ratio is timed beside 5 copies (3x the cores, not 7: the
    first plan on a machine pays those seconds; not 3: beside 3 copies four timings in a row
    gave crowding 0.002-0.178, beside 5 0.108-0.146), and the coefficient is its excess per
    unit of the oversubscription it was timed at; no crowding (and no timing) where ranks
    fit; fewer ranks than that: timed beside all the others."""
    asked = []

    def ratio(micro_batch, copies):
        asked.append((micro_batch, copies))
        return 1.1

    ctx = SimpleNamespace(lab=SimpleNamespace(cores=2), world_size=8, crowded_ratio=ratio,
                          local_batch=64)
    assert stage_crowding(ctx) == pytest.approx(0.05)  # (1.1 - 1) / ((5 + 1) / 2 - 1)
    assert asked == [(64, 5)]
    assert stage_crowding(SimpleNamespace(lab=SimpleNamespace(cores=2), world_size=2,
                                          crowded_ratio=ratio, local_batch=64)) == 0.0
    assert asked == [(64, 5)]
    # stars6's six ranks: beside the five others; four ranks: beside three
    assert stage_crowding(SimpleNamespace(lab=SimpleNamespace(cores=2), world_size=4,
                                          crowded_ratio=ratio, local_batch=64)) == (
        pytest.approx(0.1))
    assert asked[-1] == (64, 3)
    # one timing per model: at the grid point below the ranks' batch (48 rows), whatever the
    # micro-batch the pipeline runs
    assert stage_crowding(SimpleNamespace(lab=SimpleNamespace(cores=2), world_size=8,
                                          crowded_ratio=ratio, local_batch=50)) > 0
    assert asked[-1] == (48, 5)


def test_a_crowding_ratio_below_one_is_no_ratio():
    """Faster beside copies than alone: the machine was busy during the timing alone."""
    from topoctl.graph.cost import TrainCost
    from topoctl.graph.profile import crowding_ratio

    alone = {"a": TrainCost(1.0, 0.0, 1.0, 0.5), "b": TrainCost(0.5, 0.0, 0.0)}
    assert crowding_ratio(alone, {k: TrainCost(c.fwd * 1.2, 0.0, c.bwd_inputs * 1.2,
                                               c.step * 1.2) for k, c in alone.items()}) \
        == pytest.approx(1.2)
    assert crowding_ratio(alone, {k: TrainCost(c.fwd * 0.9, 0.0, c.bwd_inputs * 0.9,
                                               c.step * 0.9) for k, c in alone.items()}) is None
    assert crowding_ratio({"a": TrainCost(0.0, 0.0, 0.0)}, alone) is None
