"""bench/common/trees.py: the cost model's prediction for any tree schedule on a cluster's
cables (`python -m bench.trees.allreduce_lab --plan` runs a plan's own trees with it)."""

from __future__ import annotations

import pytest

from bench.common import PLANS
from bench.common.trees import cluster_cables, schedule_prediction, trees_for
from topocontract.schedule import TreeSchedule

NBYTES = 16672800


def test_packed_trees_predicted_the_same_from_their_schedule():
    """The trees' rate found from the cables' loads is the one the packer planned."""
    hosts, links, mtu = cluster_cables(PLANS / "hetero8-cluster.yaml")
    _, _, sched, pred = trees_for(hosts, links, mtu, NBYTES)
    again = schedule_prediction(sched, hosts, links, mtu, NBYTES)
    assert again.chunks == pred.chunks
    assert again.network_s == pytest.approx(pred.network_s, rel=1e-9)
    assert again.cpu_s == pytest.approx(pred.cpu_s, rel=1e-9)


def test_path_trees_on_a_ring_run_at_the_ring_s_rate():
    """Eight path trees on a ring of 8 (TopoOpt's stride-1 ring as path trees, each rooted at
    a different host and running both ways around it): the rate comes from the cables the
    trees' edges load, so halving every cable doubles the network part; a tree edge that is
    no cable is an error."""
    n = 8
    hosts = [f"h{i}" for i in range(n)]
    trees = []
    for root in range(n):  # down one way for half the ring, the other way for the rest
        parents = [None] * n
        for k in range(1, n):
            r = (root + k) % n
            parents[r] = (r - 1) % n if k <= n // 2 else (r + 1) % n
        trees.append({"root": root, "parents": parents, "rate": 1.0})
    sched = TreeSchedule.model_validate({"world_size": n, "chunk_bytes": 32768,
                                         "trees": trees})
    fast = [(hosts[i], hosts[(i + 1) % n], 25e6) for i in range(n)]
    slow = [(a, b, c / 2) for a, b, c in fast]
    p_fast = schedule_prediction(sched, hosts, fast, 9000, NBYTES, credit_s=0.0)
    p_slow = schedule_prediction(sched, hosts, slow, 9000, NBYTES, credit_s=0.0)
    assert p_fast.chunks == p_slow.chunks
    assert p_slow.network_s == pytest.approx(2 * p_fast.network_s, rel=1e-9)
    # the lab's cables send their token credit at once after idling: never slower
    lab = schedule_prediction(sched, hosts, fast, 9000, NBYTES)
    assert lab.network_s < p_fast.network_s
    with pytest.raises(ValueError, match="h[01]-h[01] is not a cable"):
        schedule_prediction(sched, hosts, fast[1:], 9000, NBYTES)
