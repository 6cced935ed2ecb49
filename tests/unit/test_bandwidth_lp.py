"""The per-destination bandwidth LP: capacities respected, optimal on hand-solved cases."""

from __future__ import annotations

import pytest

from topoctl.bandwidth.lp import BandwidthError, allocate


def _check_capacity(alloc, capacity):
    for ln, load in alloc.link_load().items():
        assert load <= capacity[ln] * (1 + 1e-7), ln


def test_two_destinations_share_one_link_in_proportion_to_demand():
    # h0 sends 3 MB to h1 and 1 MB to h2 over one 1 MB/s uplink: the fair share (0.5/0.5)
    # finishes at 6 s, the LP at 4 s with rates 0.75 / 0.25
    cap = {"h0>sw": 1e6, "sw>h1": 1e6, "sw>h2": 1e6}
    demand = {("h0", "h1"): 3e6, ("h0", "h2"): 1e6}
    paths = {("h0", "h1"): [("h0>sw", "sw>h1")], ("h0", "h2"): [("h0>sw", "sw>h2")]}
    a = allocate(demand, paths, cap)
    assert a.time == pytest.approx(4.0)
    assert a.total(("h0", "h1")) == pytest.approx(0.75e6)
    assert a.total(("h0", "h2")) == pytest.approx(0.25e6)
    _check_capacity(a, cap)
    p = allocate(demand, paths, cap, "proportional")  # one link: proportional is optimal too
    assert p.time == pytest.approx(4.0)


def test_multipath_detour_when_the_direct_link_is_not_enough():
    # triangle a-b-c, 1 unit/s each direction; a sends 2 units to b, nothing else: direct
    # (1/s) plus the detour a>c>b (1/s) finish in 1 s instead of 2 s
    cap = {x: 1.0 for x in ("a>b", "a>c", "c>b", "b>a", "c>a", "b>c")}
    demand = {("a", "b"): 2.0}
    paths = {("a", "b"): [("a>b",), ("a>c", "c>b")]}
    a = allocate(demand, paths, cap)
    assert a.time == pytest.approx(1.0)
    rates = dict(a.rates[("a", "b")])
    assert rates[("a>b",)] == pytest.approx(1.0) and rates[("a>c", "c>b")] == pytest.approx(1.0)
    _check_capacity(a, cap)
    assert allocate(demand, paths, cap, "proportional").time == pytest.approx(2.0)


def test_no_detour_when_the_direct_link_suffices():
    # a->b 1 unit and c->b 1 unit: a's detour via c would steal c's link; the LP keeps both
    # direct (time 1 s) and the usage stage adds no detour
    cap = {x: 1.0 for x in ("a>b", "a>c", "c>b", "b>a", "c>a", "b>c")}
    demand = {("a", "b"): 1.0, ("c", "b"): 1.0}
    paths = {("a", "b"): [("a>b",), ("a>c", "c>b")], ("c", "b"): [("c>b",), ("c>a", "a>b")]}
    a = allocate(demand, paths, cap)
    assert a.time == pytest.approx(1.0)
    assert [p for p, _ in a.rates[("a", "b")]] == [("a>b",)]
    assert [p for p, _ in a.rates[("c", "b")]] == [("c>b",)]


def test_ring_on_a_full_mesh_uses_the_idle_links():
    # 4 hosts fully meshed (1 unit/s per direction), ring 0->1->2->3->0 each sending 1 unit:
    # direct alone takes 1 s; with the two 2-hop detours per pair the LP balances every arc
    hosts = ["0", "1", "2", "3"]
    cap = {f"{u}>{v}": 1.0 for u in hosts for v in hosts if u != v}
    demand = {(hosts[i], hosts[(i + 1) % 4]): 1.0 for i in range(4)}
    paths = {(s, d): [(f"{s}>{d}",)] + [(f"{s}>{m}", f"{m}>{d}") for m in hosts
                                         if m not in (s, d)] for s, d in demand}
    a = allocate(demand, paths, cap)
    # hand-solved: 12 arcs of capacity 1; rate 2 per pair = direct 1 + two detours 0.5 each
    # loads every arc exactly 1 (4 direct + 4 pairs * 2 detours * 2 arcs * 0.5): T = 0.5
    assert a.time == pytest.approx(0.5)
    _check_capacity(a, cap)


def test_errors():
    with pytest.raises(BandwidthError, match="no candidate path"):
        allocate({("a", "b"): 1.0}, {}, {})
    with pytest.raises(BandwidthError, match="objective"):
        allocate({}, {}, {}, "fastest")
    assert allocate({("a", "b"): 0.0}, {}, {}).rates == {}


def test_deterministic():
    hosts = ["0", "1", "2", "3"]
    cap = {f"{u}>{v}": 1.0 for u in hosts for v in hosts if u != v}
    demand = {(hosts[i], hosts[(i + 1) % 4]): 1.0 + i for i in range(4)}
    paths = {(s, d): [(f"{s}>{d}",)] + [(f"{s}>{m}", f"{m}>{d}") for m in hosts
                                         if m not in (s, d)] for s, d in demand}
    assert allocate(demand, paths, cap).rates == allocate(demand, paths, cap).rates
