"""Bounds (strategies/bounds) against brute force over all node subsets and partitions."""

from __future__ import annotations

import itertools
import random

import pytest

from topoctl.collective.trees.bounds import (
    best_bound,
    cut_bound,
    ingress_bound,
    partition_bound,
    rsag_optimum,
    tree_bounds,
)
from topoctl.fabric.capgraph import build_capgraph


def fabric(seed: int, switches: int):
    rng = random.Random(seed)
    n = 6
    names = [f"w{i}" for i in range(n)] + [f"s{j}" for j in range(switches)]
    links = [(names[i], names[i + 1], rng.choice([1, 3, 7])) for i in range(len(names) - 1)]
    for a, b in itertools.combinations(names, 2):
        if rng.random() < 0.35:
            links.append((a, b, rng.choice([1, 2, 5])))
    return build_capgraph(links, names[:n])


def brute_cut(g):
    """min over node sets S separating two workers of B_out(S) (links are symmetric)."""
    best = float("inf")
    w = set(g.workers)
    for mask in range(1, 2**g.n - 1):
        s = {i for i in range(g.n) if mask >> i & 1}
        if not (s & w) or w <= s:
            continue
        best = min(best, sum(c for a, b, c in zip(g.u, g.v, g.cap, strict=True)
                             if (a in s) != (b in s)))
    return best


def brute_rsag(g):
    """N / (2 max_S |S cap W| / B_out(S)) over S with W not inside S."""
    w = set(g.workers)
    rho = 0.0
    for mask in range(1, 2**g.n):
        s = {i for i in range(g.n) if mask >> i & 1}
        if not (s & w) or w <= s:
            continue
        bout = sum(c for a, b, c in zip(g.u, g.v, g.cap, strict=True) if (a in s) != (b in s))
        rho = max(rho, len(s & w) / bout)
    return len(w) / (2 * rho)


@pytest.mark.parametrize("seed,switches", [(0, 0), (1, 0), (2, 2), (3, 3), (4, 1)])
def test_cut_and_rsag_match_brute_force(seed, switches):
    g = fabric(seed, switches)
    lam, complete = cut_bound(g)
    assert complete
    assert lam == pytest.approx(brute_cut(g), rel=1e-9)
    rate, exact = rsag_optimum(g)
    assert exact
    assert rate == pytest.approx(brute_rsag(g), rel=1e-4)


def test_partition_heuristic_is_an_upper_bound_and_exact_when_clustered():
    rng = random.Random(7)
    links = [(a, b, rng.choice([1, 4, 9])) for a, b in itertools.combinations(range(8), 2)
             if rng.random() < 0.7 or b == a + 1]
    g = build_capgraph(links)
    exact, _, is_exact = partition_bound(g)
    heur, _, not_exact = partition_bound(g, exact_up_to=0)
    assert is_exact and not not_exact
    assert heur >= exact - 1e-12
    racks = build_capgraph([(a, b, 10 if a // 4 == b // 4 else 1)
                            for a, b in itertools.combinations(range(8), 2)])
    tau, parts, _ = partition_bound(racks, exact_up_to=0)
    assert tau == 16 and sorted(map(sorted, parts)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_ingress_and_best_bound():
    g = build_capgraph([(f"w{i}", "sw", 2.0) for i in range(5)], [f"w{i}" for i in range(5)])
    assert ingress_bound(g) == pytest.approx(10.0 / 8)
    b = tree_bounds(g)
    assert "partition" not in b
    name, val = best_bound(b)
    assert name == "ingress" and val == pytest.approx(1.25)
    assert b["rsag"] == pytest.approx(1.25)  # star: trees and RS+AG coincide
    with pytest.raises(ValueError, match="direct-connect"):
        partition_bound(g)


def test_notes_example_bounds():
    links = [(a, b, 1.0 if 7 in (a, b) else 10.0) for a, b in itertools.combinations(range(8), 2)]
    b = tree_bounds(build_capgraph(links))
    assert b["partition"] == pytest.approx(7.0) and b["cut"] == pytest.approx(7.0)
    assert 1 / b["rsag"] == pytest.approx(0.25)  # time per byte of the best RS+AG
