"""TopoOpt's fabric algorithms: TotientPerms strides, matching, TopologyFinder, routing."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

from topoagent.protocol import TopoError
from topoctl.fabric.routes import ecmp_next_hops, ecmp_paths, k_shortest_paths, neighbour_counts
from topoctl.topoopt.matching import exact_matching, greedy_matching, mp_links
from topoctl.topoopt.topology import ArGroup, degree_split, distances, find_topology
from topoctl.topoopt.totient import (
    TopologyError,
    candidate_strides,
    circulant_distances,
    decompose,
    geometric_strides,
    score,
    search_strides,
)


def test_candidates_are_coprime_and_canonical():
    assert candidate_strides(12) == [1, 5]
    assert candidate_strides(7) == [1, 2, 3]
    assert candidate_strides(128)[:3] == [1, 3, 5] and len(candidate_strides(128)) == 32
    # a group of 6 on 12 servers: placement stride 2, k coprime with 6
    assert candidate_strides(12, 6) == [2]
    assert candidate_strides(16, 8) == [2, 6]


@pytest.mark.parametrize("n,r,strides,diam", [(128, 2, [1, 13], 10), (128, 3, [1, 7, 27], 6),
                                              (128, 4, [1, 5, 13, 39], 5)])
def test_geometric_rule_matches_the_authors_values(n, r, strides, diam):
    assert geometric_strides(n, r) == strides
    assert score(n, strides).diameter == diam


def test_search_beats_the_geometric_rule_at_128_servers_degree_4():
    s = search_strides(128, 2)
    assert score(128, s).diameter == 8  # geometric {1, 13}: 10
    assert score(128, [1, 15]).diameter == 8
    assert score(128, s).mean_hops <= score(128, [1, 15]).mean_hops
    assert score(128, s).mean_hops < score(128, [1, 13]).mean_hops


def test_search_is_never_worse_than_geometric_and_deterministic():
    for n, r in [(128, 3), (128, 4), (96, 2), (1024, 2)]:
        s = search_strides(n, r)
        assert s == search_strides(n, r)
        assert score(n, s).key <= score(n, geometric_strides(n, r)).key


def test_circulant_distances_agree_with_networkx():
    for n, st in [(12, [1, 5]), (31, [1, 7]), (64, [3, 13])]:
        g = nx.circulant_graph(n, st)
        ref = nx.single_source_shortest_path_length(g, 0)
        dist = circulant_distances(n, st)
        assert [ref[i] for i in range(n)] == dist.tolist()
        assert score(n, st).diameter == nx.diameter(g)


def test_too_few_strides_odd_n_and_tiny_n():
    assert search_strides(6, 2) == [1, 2]  # only stride 1 is coprime with 6: a non-coprime one
    assert search_strides(2, 2) == [1, 1]  # nothing else exists: parallel cables
    s = search_strides(7, 3)
    assert sorted(s) == [1, 2, 3] and score(7, s).diameter == 1


def test_weighted_search_prefers_the_heavy_offset():
    w = np.zeros(64)
    w[9] = w[55] = 100.0
    s = search_strides(64, 2, weights=w, fixed=[1])
    assert 9 in s


def test_decompose_is_coin_change():
    assert decompose(128, [1, 15], 15) == [15]
    assert decompose(128, [1, 15], 16) in ([1, 15], [15, 1])
    hops = decompose(128, [1, 15], 40)
    assert sum(hops) % 128 == 40 and len(hops) == circulant_distances(128, [1, 15])[40]
    with pytest.raises(TopologyError):
        decompose(12, [2], 3)


def test_matching_serves_heavy_pairs_and_respects_ports():
    demand = {(0, 1): 10.0, (2, 3): 8.0, (0, 2): 1.0, (1, 3): 1.0}
    assert exact_matching(demand) == {(0, 1), (2, 3)}
    assert greedy_matching(demand) == {(0, 1), (2, 3)}
    cables, method = mp_links(4, demand, rounds=3, free_ports=[3, 1, 3, 3])
    assert method == "blossom"
    deg = [0] * 4
    for a, b in cables:
        deg[a] += 1
        deg[b] += 1
    assert deg[1] <= 1 and max(deg) <= 3
    # round 2: h1 is full; (2,3) still outweighs (0,2) after halving, and again after thirds
    assert cables == [(0, 1), (2, 3), (2, 3), (2, 3)]


def test_degree_split():
    assert degree_split(4, 1.0, 0.0) == 4
    assert degree_split(8, 1.0, 1.0) == 4
    assert degree_split(8, 1.0, 100.0) == 2  # AllReduce keeps at least one ring
    assert degree_split(5, 1.0, 0.0) == 4
    assert degree_split(8, 1.0, 1.0, all_allreduce=True) == 8


@pytest.mark.parametrize("n,d", [(12, 4), (128, 4), (128, 8), (7, 3), (9, 5), (2, 4)])
def test_finder_degree_never_exceeded_and_connected(n, d):
    t = find_topology(n, d, [ArGroup(n, 1e8)])
    deg = [0] * n
    for c in t.cables:
        deg[c.a] += 1
        deg[c.b] += 1
    assert max(deg) <= d
    ports = {(c.a, c.a_port) for c in t.cables} | {(c.b, c.b_port) for c in t.cables}
    assert len(ports) == 2 * len(t.cables)  # every port used once
    assert all(p < d for _, p in ports)
    assert np.isfinite(distances(n, [(c.a, c.b) for c in t.cables])).all()
    assert t.to_dict() == find_topology(n, d, [ArGroup(n, 1e8)]).to_dict()  # deterministic


def test_finder_at_128_degree_4_has_diameter_8():
    t = find_topology(128, 4, [ArGroup(128, 1e8)])
    assert t.strides == [1, 15] and t.diameter == 8


def test_finder_mp_links_and_smaller_groups_keep_a_full_ring():
    mp = {(0, 6): 5e8, (3, 9): 4e8, (1, 2): 1e7}
    t = find_topology(12, 4, [ArGroup(6, 1e8)], mp)
    assert t.allreduce_degree == 2 and t.mp_degree == 2
    assert 1 in t.strides  # the groups of 6 are not the cluster: keep the stride-1 ring
    kinds = {(c.a, c.b): c.kind for c in t.cables}
    assert kinds.get((0, 6)) == "mp" and kinds.get((3, 9)) == "mp"
    t2 = find_topology(12, 4, [ArGroup(6, 1e8)], mp, all_allreduce=True)
    assert t2.allreduce_degree == 4 and t2.ring_groups[6] == [2]


def test_bad_requests_are_topo_errors():
    with pytest.raises(TopoError, match="at least 2 servers"):
        find_topology(1, 4)
    with pytest.raises(TopoError, match="larger than the 4 ports"):
        find_topology(12, 6, ports=4)
    with pytest.raises(TopoError, match="cannot be laid out"):
        find_topology(12, 4, [ArGroup(5, 1.0)])
    with pytest.raises(TopoError, match="at least 2 ports"):
        find_topology(12, 1)
    with pytest.raises(TopoError, match="need 6 ports"):
        find_topology(12, 4, [ArGroup(12, 3.0), ArGroup(6, 2.0), ArGroup(4, 1.0)],
                      require_rings=True)


def test_ecmp_and_k_shortest():
    cables = [(i, (i + 1) % 6) for i in range(6)]
    dist = distances(6, cables)
    nb = neighbour_counts(6, cables)
    assert ecmp_next_hops(dist, nb, 0, 3) == [(1, 1), (5, 1)]
    assert ecmp_next_hops(dist, nb, 0, 2) == [(1, 1)]
    paths = ecmp_paths(dist, nb, 0, 3)
    assert sorted(p for _, p in paths) == [[0, 1, 2, 3], [0, 5, 4, 3]]
    assert math.isclose(sum(s for s, _ in paths), 1.0)
    ks = k_shortest_paths(6, cables, 0, 2, 2)
    assert ks[0] == [0, 1, 2] and ks[1] == [0, 5, 4, 3, 2]
