"""Simulator against closed forms: single flow, shared link, ring AllReduce, pipeline."""

from __future__ import annotations

import math
import random

import pytest

from topoctl.sim import Collective, Compute, Network, Transfer, maxmin_rates, ring_allreduce
from topoctl.sim.engine import SimError, simulate
from topoctl.sim.network import Link, star, static_router
from topoctl.sim.schedules import Schedule, Step, from_phases, ring_allgather


def line(capacity: float, latency: float = 0.0) -> Network:
    """a -> b -> c, one link each way per hop."""
    links = {k: Link(k, k[0], k[-1], capacity, latency) for k in ("a>b", "b>c", "b>a", "c>b")}
    paths = {("a", "b"): [(1.0, ("a>b",))], ("b", "c"): [(1.0, ("b>c",))],
             ("a", "c"): [(1.0, ("a>b", "b>c"))], ("b", "a"): [(1.0, ("b>a",))]}
    return Network(links, static_router(paths))


def test_single_flow_is_size_over_bandwidth_plus_latency():
    for size, cap, lat in [(1e6, 1e8, 0.0), (3e7, 2.5e9, 1e-3), (5.0, 1.0, 0.25)]:
        r = simulate([Transfer("t", "a", "c", size)], line(cap, lat))
        assert r.iteration_time == pytest.approx(size / cap + 2 * lat)


def test_two_flows_sharing_a_link_each_get_half_then_the_rest():
    net = line(100.0)
    # a->c and b->c share b>c: both at 50 until the small one ends at 2*50/100... closed form:
    s1, s2 = 100.0, 300.0
    r = simulate([Transfer("x", "a", "c", s1), Transfer("y", "b", "c", s2)], net)
    t_small = s1 / 50.0
    t_big = t_small + (s2 - 50.0 * t_small) / 100.0
    assert r.finish["x"] == pytest.approx(t_small)
    assert r.finish["y"] == pytest.approx(t_big)
    assert r.iteration_time == pytest.approx((s1 + s2) / 100.0)  # the shared link never idles


def test_maxmin_is_fair_and_feasible_on_random_instances():
    rng = random.Random(7)
    for _ in range(30):
        links = {f"l{i}": rng.uniform(1, 10) for i in range(6)}
        flows = {f: tuple(rng.sample(sorted(links), rng.randint(1, 3))) for f in range(8)}
        rates = maxmin_rates(flows, links)
        load = dict.fromkeys(links, 0.0)
        for f, path in flows.items():
            for ln in path:
                load[ln] += rates[f]
        assert all(load[ln] <= links[ln] * (1 + 1e-9) for ln in links)
        # max-min: every flow has a saturated link on which it has the largest rate
        for f, path in flows.items():
            assert any(load[ln] >= links[ln] * (1 - 1e-9)
                       and rates[f] >= max(rates[g] for g in flows if ln in flows[g]) - 1e-9
                       for ln in path)


def test_maxmin_known_instance():
    assert maxmin_rates({1: ("a",), 2: ("a", "b"), 3: ("b",)}, {"a": 1, "b": 3}) == \
        pytest.approx({1: 0.5, 2: 0.5, 3: 2.5})
    assert maxmin_rates({"local": ()}, {}) == {"local": math.inf}


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_ring_allreduce_matches_2_n_minus_1_over_n_s_over_b(n):
    hosts = [f"h{i}" for i in range(n)]
    size, bw, lat = 4e8, 1.25e9, 2e-5
    r = simulate([Collective("ar", ring_allreduce(hosts, size))], star(hosts, bw, lat))
    assert r.iteration_time == pytest.approx(2 * (n - 1) / n * size / bw + 2 * (n - 1) * lat)


def test_ring_in_any_order_on_a_star_costs_the_same_but_not_on_a_line():
    hosts = ["a", "b", "c"]
    net = star(hosts, 10.0)
    t1 = simulate([Collective("r", ring_allreduce(hosts, 30.0))], net).iteration_time
    t2 = simulate([Collective("r", ring_allreduce(["c", "a", "b"], 30.0))], net).iteration_time
    assert t1 == pytest.approx(t2)
    # on the line a-b-c the ring over [a, b, c] (each member sends to the one before it:
    # a->c, c->b, b->a) shares no directed link (a->c uses a>b, b>c)
    links = {k: Link(k, k[0], k[-1], 10.0) for k in ("a>b", "b>c", "b>a", "c>b")}
    paths = {("a", "b"): [(1.0, ("a>b",))], ("b", "c"): [(1.0, ("b>c",))],
             ("c", "a"): [(1.0, ("c>b", "b>a"))], ("a", "c"): [(1.0, ("a>b", "b>c"))],
             ("c", "b"): [(1.0, ("c>b",))], ("b", "a"): [(1.0, ("b>a",))]}
    net2 = Network(links, static_router(paths))
    assert simulate([Collective("r", ring_allreduce(["a", "b", "c"], 30.0))],
                    net2).iteration_time == pytest.approx(t1)
    # a background flow on a>b halves the ring's a->c path for the whole run: the pipelined
    # ring runs at its bottleneck, 2(n-1)/n * S / (B/2) = 4 * 10 / 5
    bg = simulate([Collective("r", ring_allreduce(["a", "b", "c"], 30.0)),
                   Transfer("bg", "a", "b", 1e6)], net2)
    assert bg.finish["r"] == pytest.approx(2 * 2 / 3 * 30.0 / 5.0)


def test_ring_sends_the_way_gloo_does():
    """gloo's ring (what DDP runs) has each rank send to the rank before it: measured in the
    lab (every host's ring bytes leave on the cable to the host before it), so the bandwidth
    post-pass gives its per-destination classes to those pairs."""
    sched = ring_allreduce(["a", "b", "c", "d"], 4.0)
    assert {(s.src, s.dst) for s in sched.steps} == {("a", "d"), ("b", "a"), ("c", "b"),
                                                     ("d", "c")}
    # round 2's step from b forwards what b received in round 1 (from c)
    first, second = sched.steps[:4], sched.steps[4:8]
    for s in second:
        (dep,) = s.deps
        assert first[dep].dst == s.src


@pytest.mark.parametrize("caps", [(1.0, 4.0, 2.0, 8.0), (5.0, 1.0, 1.0, 3.0, 2.0, 9.0),
                                  (2.0, 2.0, 0.5)])
def test_ring_over_uneven_links_runs_at_its_slowest_link(caps):
    """Steps between two members share one connection (FIFO), so the ring pipelines and the
    slowest link is never idle: 2(n-1)/n * S / min(B) (measured in the lab: hetero8, 4.51 s
    against 4.48 s predicted)."""
    n = len(caps)
    hosts = [f"h{i}" for i in range(n)]
    links, paths = {}, {}
    for i, c in enumerate(caps):
        a, b = hosts[i], hosts[(i - 1) % n]  # the ring's direction: to the member before
        links[f"{a}>{b}"] = Link(f"{a}>{b}", a, b, c)
        paths[(a, b)] = [(1.0, (f"{a}>{b}",))]
    size = 60.0
    r = simulate([Collective("r", ring_allreduce(hosts, size))],
                 Network(links, static_router(paths)))
    assert r.iteration_time == pytest.approx(2 * (n - 1) / n * size / min(caps))


def test_two_stage_pipeline_closed_form():
    """m micro-batches, stage time t on two devices, activation transfer c = size/B + lat:
    finish = m*t + c + t when c <= t (the transfers never overlap)."""
    for m, t, size, bw, lat in [(1, 1.0, 10.0, 20.0, 0.1), (4, 1.0, 10.0, 20.0, 0.1),
                                (7, 0.3, 3.0, 100.0, 0.01)]:
        net = line(bw, lat)
        tasks = []
        for i in range(m):
            tasks.append(Compute(f"s1.{i}", "a", t, (f"s1.{i - 1}",) if i else ()))
            tasks.append(Transfer(f"x.{i}", "a", "b", size, (f"s1.{i}",)))
            tasks.append(Compute(f"s2.{i}", "b", t, (f"x.{i}",)))
        r = simulate(tasks, net)
        c = size / bw + lat
        assert r.iteration_time == pytest.approx(m * t + c + t)
        assert r.compute_time == pytest.approx(m * t)


def test_compute_stream_runs_one_task_at_a_time_in_list_order():
    tasks = [Compute("x", "d", 1.0), Compute("y", "d", 2.0), Compute("z", "e", 0.5, ("x",))]
    r = simulate(tasks, star(["d", "e"], 1.0))
    assert r.finish == pytest.approx({"x": 1.0, "y": 3.0, "z": 1.5})
    assert r.device_busy == pytest.approx({"d": 3.0, "e": 0.5})


def test_a_runtimes_own_time_is_not_counted_as_compute():
    """`Compute.communication` (the tree runtime's CPU part on its pseudo-device) takes time
    like any task, but the busiest device's compute is the model's: here "d"'s 1 s, not the
    runtime's 3 s, so 3 s of the 4 s iteration are exposed communication."""
    tasks = [Compute("fwd", "d", 1.0), Compute("ar/cpu", "rt", 3.0, ("fwd",), communication=True)]
    r = simulate(tasks, star(["d"], 1.0))
    assert r.iteration_time == pytest.approx(4.0)
    assert r.device_busy == pytest.approx({"d": 1.0, "rt": 3.0})
    assert r.compute_time == pytest.approx(1.0)
    assert r.exposed_comm == pytest.approx(3.0)


def test_overlap_hides_communication_behind_compute():
    hosts = ["a", "b"]
    net = star(hosts, 10.0)
    tasks = [Compute(f"c.{h}", h, 5.0) for h in hosts]
    tasks += [Collective("ar", ring_allreduce(hosts, 20.0))]  # 2*(1/2)*20/10 = 2 s, hidden
    r = simulate(tasks, net)
    assert r.iteration_time == pytest.approx(5.0)
    assert r.exposed_comm == pytest.approx(0.0)


def test_rate_cap_and_multipath():
    links = {k: Link(k, "a", "b", 10.0) for k in ("p", "q")}
    net = Network(links, static_router({("a", "b"): [(3.0, ("p",)), (1.0, ("q",))]}))
    r = simulate([Transfer("t", "a", "b", 40.0)], net)
    assert r.iteration_time == pytest.approx(3.0)  # 30 bytes on p at 10/s
    assert r.link_bytes == pytest.approx({"p": 30.0, "q": 10.0})
    net.rate_caps[("a", "b")] = 4.0  # aggregate ceiling for a->b
    r = simulate([Transfer("t", "a", "b", 40.0)], net)
    assert r.iteration_time == pytest.approx(40.0 / 4.0)


def test_tree_like_schedule_plugs_in():
    """A two-level reduce + broadcast written as a Schedule; the engine only sees steps."""
    s = Schedule("tree", ("r", "x", "y"), (
        Step("x", "r", 10.0), Step("y", "r", 10.0),
        Step("r", "x", 10.0, (0, 1)), Step("r", "y", 10.0, (0, 1))))
    s.check()
    r = simulate([Collective("t", s)], star(["r", "x", "y"], 10.0))
    assert r.iteration_time == pytest.approx(2 * 20.0 / 10.0)  # r's down/uplink carry 20 each
    ph = from_phases("p", ("a", "b"), [[("a", "b", 5.0)], [("b", "a", 5.0)]])
    assert simulate([Collective("p", ph)], star(["a", "b"], 5.0)).iteration_time == \
        pytest.approx(2.0)
    assert len(ring_allgather(["a", "b", "c"], 9.0).steps) == 6


def test_bad_graphs_are_rejected():
    with pytest.raises(SimError, match="unknown task"):
        simulate([Compute("a", "d", 1.0, ("nope",))], star(["d"], 1.0))
    with pytest.raises(SimError, match="used twice"):
        simulate([Compute("a", "d", 1.0), Compute("a", "d", 1.0)], star(["d"], 1.0))
    with pytest.raises(SimError, match="no route"):
        simulate([Transfer("t", "a", "z", 1.0)], line(1.0))


@pytest.mark.parametrize("seed", range(6))
def test_memoised_rates_change_nothing(seed):
    """Random multi-hop networks with overlapping rings and transfers (paths repeat with
    different multiplicities): the rate memo gives exactly the unmemoised result."""
    rng = random.Random(seed)
    hosts = [f"h{i}" for i in range(6)]
    links, paths = {}, {}
    for a in hosts:
        for b in hosts:
            if a != b:
                lid = f"{a}>{b}"
                links[lid] = Link(lid, a, b, rng.choice([1.0, 2.0, 5.0]), rng.choice([0, 0.01]))
    for a in hosts:
        for b in hosts:
            if a != b:  # some pairs go through a middle host, creating shared links
                mid = rng.choice([x for x in hosts if x not in (a, b)])
                p1, p2 = (f"{a}>{b}",), (f"{a}>{mid}", f"{mid}>{b}")
                paths[(a, b)] = [(1.0, rng.choice([p1, p2]))]
    net = Network(links, static_router(paths))
    tasks = []
    for k in range(3):
        order = rng.sample(hosts, k=rng.randint(3, 6))
        tasks.append(Collective(f"r{k}", ring_allreduce(order, rng.uniform(1, 20)),
                                (f"r{k - 1}",) if k and rng.random() < 0.5 else ()))
    for k in range(4):
        a, b = rng.sample(hosts, 2)
        tasks.append(Transfer(f"t{k}", a, b, rng.uniform(1, 10)))
    fast = simulate(tasks, net)
    slow = simulate(tasks, net, memo=False)
    assert fast.finish == pytest.approx(slow.finish, rel=1e-9)
