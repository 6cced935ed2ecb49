"""Tree packing (strategies/trees): optimality against brute force, feasibility, bad input."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

from topoctl.collective.trees.bounds import partition_bound
from topoctl.collective.trees.pack import chunk_bytes, pipelined_time, plan_trees
from topoctl.fabric.capgraph import FabricError, build_capgraph, read_edges

PAIRS8 = list(itertools.combinations(range(8), 2))


def random_graph(n: int, p: float, seed: int) -> list[tuple[int, int, float]]:
    rng = random.Random(seed)
    links = [(i, i + 1, rng.choice([1, 2, 5, 10])) for i in range(n - 1)]  # connected
    for a, b in itertools.combinations(range(n), 2):
        if b != a + 1 and rng.random() < p:
            links.append((a, b, rng.choice([1, 2, 5, 10])))
    return links


def arc_loads(g, plan) -> dict[tuple[int, int], float]:
    """Load per directed node pair, recomputed from the trees' edges and routed paths."""
    load: dict[tuple[int, int], float] = {}
    w = g.workers
    for t in plan.trees:
        for p, c in t.edges:
            key = (min(p, c), max(p, c))
            if key in t.paths:
                pab, pba = t.paths[key]
                node_paths = [pab, pba]
            else:
                node_paths = [[w[p], w[c]], [w[c], w[p]]]
            for path in node_paths:
                for x, y in zip(path[:-1], path[1:], strict=True):
                    load[(x, y)] = load.get((x, y), 0.0) + t.rate
    return load


def assert_feasible(g, plan):
    cap = {}
    for a, b, c in zip(g.u.tolist(), g.v.tolist(), g.cap.tolist(), strict=True):
        cap[(a, b)] = cap[(b, a)] = c
    for arc, x in arc_loads(g, plan).items():
        assert arc in cap, f"tree uses {arc}, which is not a link"
        assert x <= cap[arc] * (1 + 1e-7), f"arc {arc} overloaded: {x} > {cap[arc]}"
    nw = len(g.workers)
    for t in plan.trees:
        assert len(t.edges) == nw - 1
        assert t.parents[t.root] is None
        for r in range(nw):  # every rank reaches the root
            cur, steps = r, 0
            while t.parents[cur] is not None:
                cur, steps = t.parents[cur], steps + 1
                assert steps <= nw
        assert t.rate > 0
    assert plan.rate == pytest.approx(sum(t.rate for t in plan.trees))


@pytest.mark.parametrize("seed", range(6))
def test_lp_reaches_partition_bound_on_random_direct_graphs(seed):
    n = 5 + seed % 4
    g = build_capgraph(random_graph(n, 0.5, seed))
    tau, _, exact = partition_bound(g)  # brute force over all partitions (n <= 9)
    assert exact
    plan = plan_trees(g, max_trees=64)
    assert plan.lp_optimum == pytest.approx(tau, rel=1e-6)
    assert plan.upper_bound >= tau * (1 - 1e-6)
    assert plan.rate == pytest.approx(tau, rel=1e-6)  # 64 trees: nothing pruned away
    assert_feasible(g, plan)


def test_heterogeneous_mesh_example_from_the_notes():
    # 8-worker full mesh, links 10, worker 7's links 1: optimum 7 (the cut around worker 7)
    links = [(a, b, 1.0 if 7 in (a, b) else 10.0) for a, b in itertools.combinations(range(8), 2)]
    g = build_capgraph(links)
    plan = plan_trees(g, max_trees=8)
    assert plan.rate == pytest.approx(7.0)
    assert len({t.root for t in plan.trees}) == len(plan.trees)  # roots spread
    assert_feasible(g, plan)


def test_two_rack_needs_sixteen_trees():
    links = [(a, b, 10.0 if a // 4 == b // 4 else 1.0) for a, b in PAIRS8]
    g = build_capgraph(links)
    full = plan_trees(g, max_trees=16)
    assert full.rate == pytest.approx(16.0)
    assert_feasible(g, full)
    # a tree's rate is at most its weakest link (1 across racks): 8 trees give at most 8
    eight = plan_trees(g, max_trees=8)
    assert len(eight.trees) <= 8
    assert eight.rate == pytest.approx(8.0)
    assert_feasible(g, eight)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pruned_plans_are_feasible_and_below_the_lp(k):
    g = build_capgraph(random_graph(8, 0.6, 42))
    plan = plan_trees(g, max_trees=k)
    assert len(plan.trees) <= k
    assert plan.rate <= plan.lp_optimum * (1 + 1e-9)
    assert_feasible(g, plan)


def test_star_with_switch_equals_reduce_scatter_allgather():
    n = 6
    g = build_capgraph([(f"w{i}", "sw", 3.0) for i in range(n)], [f"w{i}" for i in range(n)])
    plan = plan_trees(g, max_trees=8)
    assert plan.mode == "switched"
    # every worker's uplink carries reduce and broadcast: N c / (2 (N - 1))
    assert plan.rate == pytest.approx(n * 3.0 / (2 * (n - 1)), rel=1e-6)
    assert all(len(t.paths) == n - 1 for t in plan.trees)  # every edge routed via the switch
    assert_feasible(g, plan)


def test_two_level_switched_fabric_is_feasible_and_near_lp():
    links, workers = [], []
    for leaf in range(3):
        for h in range(3):
            links.append((f"h{leaf}{h}", f"l{leaf}", 4.0))
            workers.append(f"h{leaf}{h}")
        links.append((f"l{leaf}", "spine", 2.0 + leaf))
    g = build_capgraph(links, workers)
    plan = plan_trees(g, max_trees=8)
    assert plan.rate >= 0.95 * plan.upper_bound
    assert_feasible(g, plan)


@pytest.mark.parametrize(
    "links,workers,message",
    [
        ([("a", "b", 1), ("c", "d", 1)], None, "disconnected"),
        ([("a", "b", 0)], None, "capacity must be > 0"),
        ([("a", "b", -2)], None, "capacity must be > 0"),
        ([("a", "b", float("nan"))], None, "capacity must be > 0"),
        ([("a", "b", 1)], ["a", "b", "c"], "worker 'c' has no links"),
        ([("a", "b", 1)], ["a"], "at least two workers"),
        ([("a", "a", 1), ("a", "b", 1)], None, "self-loop"),
    ],
)
def test_bad_fabrics_are_refused(links, workers, message):
    with pytest.raises(FabricError, match=message):
        build_capgraph(links, workers)


def test_parallel_links_are_merged():
    g = build_capgraph([("a", "b", 1), ("b", "a", 2), ("b", "c", 4)])
    assert g.m == 2
    assert sorted(g.cap.tolist()) == [3.0, 4.0]


def test_read_edges_errors_name_the_line():
    assert read_edges(["# c", "", "a b 2.5  # x"]) == [("a", "b", 2.5)]
    with pytest.raises(FabricError, match="line 2"):
        read_edges(["a b 1", "a b"])
    with pytest.raises(FabricError, match="line 1: capacity 'x'"):
        read_edges(["a b x"])


def test_chunk_size_minimises_the_pipeline_model():
    m, r, h, a = 64e6, 1.25e9, 3, 50e-6
    s = chunk_bytes(m, r, h, a)
    best = pipelined_time(m, r, h, s, a)
    for other in (s / 4, s / 2, s * 2, s * 4):
        assert pipelined_time(m, r, h, other, a) >= best * 0.999
    assert 4096 <= s <= 4 << 20


def test_sync_cli_json(tmp_path, capsys):
    from topoctl.cli import main

    lines = [f"h{a} h{b} {10 if a // 4 == b // 4 else 1}" for a, b in PAIRS8]
    f = tmp_path / "edges.txt"
    f.write_text("\n".join(lines) + "\n")
    sched = tmp_path / "sched.yaml"
    assert main(["trees", "--edges", str(f), "--max-trees", "16", "--json", "-o", str(sched)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"trees", "rate", "optimum", "bound", "seconds"}
    assert doc["rate"] == pytest.approx(16.0) and doc["optimum"] == pytest.approx(16.0)
    assert doc["bound"] == "partition"
    for t in doc["trees"]:
        assert set(t) == {"root", "edges", "paths", "rate"} and len(t["edges"]) == 7
    from topotrain.collectives import load_schedule

    s = load_schedule(sched)
    assert s.world_size == 8 and sum(t.rate for t in s.trees) == pytest.approx(16.0)


def test_sync_cli_switch_paths_and_errors(tmp_path, capsys):
    from topoctl.cli import main

    f = tmp_path / "e.txt"
    f.write_text("a s 1\nb s 1\nc s 1\n")
    assert main(["trees", "--edges", str(f), "--workers", "a,b,c", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    paths = [p for t in doc["trees"] for p in t["paths"].values()]
    assert paths and all(p[1] == "s" and len(p) == 3 for p in paths)
    f.write_text("a b 1\nc d 1\n")
    assert main(["trees", "--edges", str(f)]) == 1
    assert "disconnected" in capsys.readouterr().err


def test_simulated_tree_schedule_beats_ring_on_two_racks():
    from topoctl.collective.trees.schedule import plan_to_schedule
    from topoctl.collective.trees.simulate import tree_allreduce_schedule
    from topoctl.fabric.graph import FabricGraph, FabricLink
    from topoctl.sim import Collective, ring_allreduce, simulate
    from topoctl.sim.fabric import network_from_fabric
    from topoctl.sim.routing import shortest_next_hops

    links = [(f"h{a}", f"h{b}", 10.0 if a // 4 == b // 4 else 1.0)
             for a, b in itertools.combinations(range(8), 2)]
    g = build_capgraph(links)
    plan = plan_trees(g, max_trees=16)
    sched = plan_to_schedule(plan, chunk_bytes=1 << 16)
    members = [str(g.nodes[w]) for w in g.workers]
    # the simulator's network of the same full mesh, 1 unit = 1 MB/s: every pair has its link
    fab = FabricGraph("direct", tuple(members),
                      links=tuple(FabricLink(a, b, int(c * 8e6)) for a, b, c in links))
    net = network_from_fabric(fab, shortest_next_hops(fab), efficiency=1.0)
    size = 1e7
    trees = simulate([Collective("t", tree_allreduce_schedule(members, size, sched, 32))], net)
    ring = simulate([Collective("r", ring_allreduce(members, size))], net)
    ideal = size / (plan.rate * 1e6)
    # pipeline fill ((32 + 2h - 1) / 32 for h <= 3) plus max-min sharing of the rack links,
    # which does not give every tree exactly its LP rate
    assert ideal <= trees.iteration_time <= ideal * 1.4
    assert ring.iteration_time / trees.iteration_time > 15
    assert np.isfinite(trees.iteration_time)
