"""Coarsening (fusion to a fixpoint) and co-location groups on hand-made and random DAGs."""

from __future__ import annotations

import random

import pytest

from topoctl.graph.coarsen import (
    CoarseGraph,
    Node,
    coarsen,
    coarsen_graph,
    colocate,
    from_opgraph,
    quotient,
)


def dag(costs: dict[str, float], edges: dict[tuple[str, str], int]) -> CoarseGraph:
    return CoarseGraph({k: Node(k, [k], c, 1) for k, c in costs.items()}, dict(edges))


def test_a_chain_fuses_into_one_node():
    g = dag({c: 1.0 for c in "abcde"}, {(a, b): 10 for a, b in zip("abcd", "bcde", strict=True)})
    k = coarsen(g, alpha=0.0)
    assert len(k.nodes) == 1 and not k.edges
    (n,) = k.nodes.values()
    assert n.ops == list("abcde") and n.cost == pytest.approx(5.0) and n.param_bytes == 5


def test_expensive_diamond_stays_cheap_branches_fold_in():
    edges = {("a", "b"): 1, ("a", "c"): 2, ("b", "d"): 3, ("c", "d"): 4}
    assert len(coarsen(dag(dict.fromkeys("abcd", 1.0), edges), alpha=0.5).nodes) == 4
    k = coarsen(dag({"a": 1.0, "b": 0.1, "c": 0.1, "d": 1.0}, edges), alpha=0.5)
    assert len(k.nodes) == 1 and sorted(next(iter(k.nodes.values())).ops) == list("abcd")


@pytest.mark.parametrize("seed", range(12))
def test_random_dags_stay_acyclic_and_conserve_everything(seed):
    rng = random.Random(seed)
    n = 40
    names = [f"n{i}" for i in range(n)]
    costs = {x: rng.choice([0.01, 1.0, 5.0]) for x in names}
    edges = {}
    for j in range(1, n):
        for i in rng.sample(range(j), k=min(j, rng.randint(1, 3))):
            edges[(names[i], names[j])] = rng.randint(1, 100)
    g = dag(costs, edges)
    k = coarsen(g, alpha=0.5)
    k.topological()  # raises on a cycle
    owner = {op: nid for nid, node in k.nodes.items() for op in node.ops}
    assert sorted(owner) == sorted(names)
    assert sum(x.cost for x in k.nodes.values()) == pytest.approx(sum(costs.values()))
    cross = {}
    for (u, v), b in edges.items():
        if owner[u] != owner[v]:
            cross[(owner[u], owner[v])] = cross.get((owner[u], owner[v]), 0) + b
    assert cross == k.edges
    assert len(k.nodes) < n
    groups = colocate(k, bandwidth=100.0)
    assert sorted(x for grp in groups for x in grp) == sorted(k.nodes)


def test_colocation_follows_the_critical_successor_and_absorbs_cheap_groups():
    # two independent chains: two groups; a cheap isolated-ish node joins its neighbour
    g = dag({"a": 1, "b": 1, "x": 1, "y": 1}, {("a", "b"): 5, ("x", "y"): 5})
    assert sorted(map(sorted, colocate(g, 1.0))) == [["a", "b"], ["x", "y"]]
    # a forks to b (heavy rank) and c (light): a stays with b; c alone unless beta absorbs it
    g = dag({"a": 1, "b": 10, "c": 0.1}, {("a", "b"): 1, ("a", "c"): 1})
    assert sorted(map(sorted, colocate(g, 1.0))) == [["a", "b"], ["c"]]
    assert sorted(map(sorted, colocate(g, 1.0, beta=0.5))) == [["a", "b", "c"]]


@pytest.mark.parametrize("seed", range(8))
def test_quotient_of_any_grouping_is_acyclic_and_conserving(seed):
    rng = random.Random(100 + seed)
    names = [f"n{i}" for i in range(30)]
    edges = {}
    for j in range(1, 30):
        for i in rng.sample(range(j), k=min(j, rng.randint(1, 3))):
            edges[(names[i], names[j])] = rng.randint(1, 50)
    g = dag({x: rng.random() for x in names}, edges)
    # arbitrary groups (not co-location ones) are the hard case: they can close cycles
    groups: dict[int, list[str]] = {}
    for x in names:
        groups.setdefault(rng.randrange(8), []).append(x)
    q = quotient(g, list(groups.values()))
    q.topological()
    assert sorted(op for n in q.nodes.values() for op in n.ops) == sorted(names)
    assert sum(n.cost for n in q.nodes.values()) == pytest.approx(sum(n.cost for n in
                                                                      g.nodes.values()))


def test_quotient_merges_a_cycle_between_groups():
    # a -> x -> b with {a, b} grouped: the group feeds x and x feeds it: one node in the end
    g = dag({"a": 1, "x": 1, "b": 1}, {("a", "x"): 1, ("x", "b"): 1})
    q = quotient(g, [["a", "b"], ["x"]])
    assert len(q.nodes) == 1 and not q.edges


@pytest.mark.parametrize("model,params", [
    ("bert", {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100}),
    ("vgg", {"depth": 11, "width": 8, "image": 32, "hidden": 64, "classes": 10}),
    ("resnet", {"depth": 18, "width": 8, "image": 32, "classes": 10}),
])
def test_catalog_models_shrink_without_cycles_and_keep_costs(model, params):
    from topoctl.graph.capture import capture_catalog
    from topoctl.graph.cost import roofline_costs
    from topoctl.graph.devices import DEVICES

    og = capture_catalog(model, params, batch=4)
    fine = from_opgraph(og, roofline_costs(og, DEVICES["A100"]))
    coarse, st = coarsen_graph(fine, bandwidth=1e9, parts=8)
    coarse.topological()
    assert st.ops_before == len(og.ops) and st.ops_after == len(coarse.nodes)
    assert 4 <= st.ops_after <= st.ops_fused < st.ops_before
    assert st.edges_after < st.edges_before
    assert st.alpha > 0 and st.beta > 0
    assert sum(n.cost for n in coarse.nodes.values()) == pytest.approx(
        sum(n.cost for n in fine.nodes.values()))
    assert sum(n.param_bytes for n in coarse.nodes.values()) == og.param_bytes
    assert sorted(op for n in coarse.nodes.values() for op in n.ops) == sorted(
        o.name for o in og.ops)
