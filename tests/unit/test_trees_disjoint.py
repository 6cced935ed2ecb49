"""Edge-disjoint spanning trees (strategies/disjoint_trees): hypercubes, brute force,
Nash-Williams/Tutte, and the planner reaching the integral packing on uniform fabrics."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from topoctl.collective.trees.bounds import partition_bound
from topoctl.collective.trees.disjoint import disjoint_spanning_trees
from topoctl.collective.trees.oracle import Oracle
from topoctl.collective.trees.pack import disjoint_candidates, plan_trees
from topoctl.fabric.capgraph import build_capgraph


def hypercube_edges(d: int) -> list[tuple[int, int]]:
    n = 1 << d
    return [(a, a ^ (1 << b)) for a in range(n) for b in range(d) if a < a ^ (1 << b)]


def is_spanning_tree(n: int, edges: list[tuple[int, int]]) -> bool:
    if len(edges) != n - 1:
        return False
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra == rb:
            return False
        parent[ra] = rb
    return True


def is_forest(n: int, edges: list[tuple[int, int]]) -> bool:
    parent = list(range(n))
    for a, b in edges:
        ra, rb = a, b
        while parent[ra] != ra:
            ra = parent[ra]
        while parent[rb] != rb:
            rb = parent[rb]
        if ra == rb:
            return False
        parent[ra] = rb
    return True


def assert_disjoint_trees(n, edges, forests, k):
    trees = [f for f in forests if len(f) == n - 1]
    assert len(trees) >= k, [len(f) for f in forests]
    used = [e for f in forests for e in f]
    assert len(used) == len(set(used)), "forests share an edge"
    for f in forests:
        assert is_forest(n, [edges[e] for e in f])
    for f in trees:
        assert is_spanning_tree(n, [edges[e] for e in f])


@pytest.mark.parametrize("d", [3, 4, 5, 6])
def test_hypercube_has_floor_half_degree_disjoint_trees(d):
    n, edges = 1 << d, hypercube_edges(d)
    k = d // 2
    for seed in range(10):
        forests = disjoint_spanning_trees(n, edges, k, seed=seed)
        assert len(forests) == k
        assert_disjoint_trees(n, edges, forests, k)


def test_hypercube_q4_one_more_tree_is_impossible():
    # 32 edges < 3 * 15: at most two disjoint spanning trees; the union is still maximum (32)
    n, edges = 16, hypercube_edges(4)
    forests = disjoint_spanning_trees(n, edges, 3)
    assert sum(len(f) for f in forests) == len(edges)
    assert sum(len(f) == n - 1 for f in forests) == 2


def brute_max_union(n, edges, k) -> int:
    """Largest total size of k edge-disjoint forests, by trying every assignment."""
    best = 0
    for assign in itertools.product(range(k + 1), repeat=len(edges)):  # k = unused
        size = sum(1 for a in assign if a < k)
        if size <= best:
            continue
        if all(is_forest(n, [edges[e] for e, a in enumerate(assign) if a == i])
               for i in range(k)):
            best = size
    return best


@pytest.mark.parametrize("seed", range(12))
def test_union_size_matches_brute_force(seed):
    rng = random.Random(seed)
    n = rng.choice([4, 5])
    pairs = list(itertools.combinations(range(n), 2))
    m = rng.randint(n, 8)
    edges = [rng.choice(pairs) for _ in range(m)]  # parallel edges allowed
    k = rng.choice([1, 2])
    forests = disjoint_spanning_trees(n, edges, k, seed=seed)
    used = [e for f in forests for e in f]
    assert len(used) == len(set(used))
    for f in forests:
        assert is_forest(n, [edges[e] for e in f])
    assert len(used) == brute_max_union(n, edges, k)


@pytest.mark.parametrize("seed", range(20))
def test_nash_williams_tutte_on_random_graphs(seed):
    """k edge-disjoint spanning trees exist iff |delta(P)| >= k (|P| - 1) for every partition:
    the packing finds floor(tau) of them (tau exact by enumeration, unit capacities)."""
    rng = random.Random(100 + seed)
    n = rng.randint(4, 8)
    links = [(i, i + 1) for i in range(n - 1)]
    for a, b in itertools.combinations(range(n), 2):
        if b != a + 1 and rng.random() < rng.choice([0.4, 0.7, 1.0]):
            links.append((a, b))
    links += [rng.choice(links) for _ in range(rng.randint(0, 6))]  # parallel links
    g = build_capgraph([(a, b, 1.0) for a, b in links])
    tau = partition_bound(g)[0]  # parallel links merged: capacity = multiplicity
    k = math.floor(tau + 1e-9)
    forests = disjoint_spanning_trees(n, links, k, seed=seed)
    assert_disjoint_trees(n, links, forests, k)
    more = disjoint_spanning_trees(n, links, k + 1, seed=seed)
    assert sum(len(f) == n - 1 for f in more) <= k


def test_two_nodes_parallel_edges_and_trivial_cases():
    assert sorted(disjoint_spanning_trees(2, [(0, 1)] * 3, 3)) == [[0], [1], [2]]
    assert disjoint_spanning_trees(3, [(0, 1), (1, 1)], 1) == [[0]]  # loop ignored
    assert disjoint_spanning_trees(3, [], 0) == []


def test_candidates_are_columns_of_disjoint_trees():
    g = build_capgraph([(a, b, 2.0) for a, b in hypercube_edges(5)])
    cols = disjoint_candidates(Oracle(g), 16)
    assert len(cols) == 2
    assert set(cols[0].rows.tolist()).isdisjoint(cols[1].rows.tolist())
    assert all(len(c.rows) == g.n - 1 for c in cols)
    # non-uniform capacities or switches: no candidates
    assert disjoint_candidates(Oracle(build_capgraph([(0, 1, 1.0), (1, 2, 2.0)])), 4) == []
    sw = build_capgraph([(0, "s", 1.0), (1, "s", 1.0), (2, "s", 1.0)], workers=[0, 1, 2])
    assert disjoint_candidates(Oracle(sw), 4) == []


def test_plan_reaches_integral_packing_on_hypercube_2_10():
    """Q10, uniform: its 5 edge-disjoint spanning trees carry 5 c against tau = 5120/1023 c
    (99.9%); MST-priced columns and pruning alone kept 4 trees plus fractions (4.67 c here)."""
    g = build_capgraph([(a, b, 4.0) for a, b in hypercube_edges(10)])
    plan = plan_trees(g, lp_iters=50, swaps=16)
    tau = partition_bound(g, exact_up_to=0)[0]
    assert plan.rate >= 5 * 4.0 * (1 - 1e-9)
    assert plan.rate >= 0.99 * tau
    loads: dict[tuple[int, int], float] = {}
    for t in plan.trees:
        assert len(t.edges) == g.n - 1
        for p, c in t.edges:
            key = (min(p, c), max(p, c))
            loads[key] = loads.get(key, 0.0) + t.rate
    assert max(loads.values()) <= 4.0 * (1 + 1e-7)
