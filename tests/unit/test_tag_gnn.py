"""TAG's GNN prior: real edge features, a distribution over the legal actions, training that
reproduces from a seed, the shipped weights planning (`tag.prior: gnn`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from topoctl.planner import prepare  # noqa: E402
from topoctl.spec.cluster_load import parse_cluster  # noqa: E402
from topoctl.spec.job import parse_job  # noqa: E402
from topoctl.strategies.tag import kit  # noqa: E402
from topoctl.tag import gnn, train  # noqa: E402
from topoctl.tag.clusters import generated  # noqa: E402
from topoctl.tag.features import joint_graph  # noqa: E402
from topoctl.tag.prior import net_prior, shipped  # noqa: E402
from topoctl.tag.search import anchors, run_search  # noqa: E402
from topoctl.tag.space import legal, plan_of  # noqa: E402

KIT = kit()


@pytest.fixture(scope="module")
def ctx():
    return prepare(parse_cluster(generated(4, 7)), parse_job(train.job_doc("vgg", 256)),
                   use_cache=False)


def test_edge_features_are_real():
    """Unlike the authors' code, tensor edges carry their bytes: a heavier edge changes the
    embedding."""
    base = dict(times=[[1.0, 2.0], [1.0, 1.0]], params=[10.0, 1e6], acts=[5.0, 5.0],
                linear=[False, True], bandwidth={(0, 1): 1e9, (1, 0): 1e9},
                memory=[1e10, 1e10])
    light = joint_graph(flow_bytes={(0, 1): 1e3}, **base)
    heavy = joint_graph(flow_bytes={(0, 1): 1e9}, **base)
    assert all(f > 0 for *_, f in light.flow + light.link + light.place)
    net = gnn.TagNet()
    assert not torch.allclose(net.embed(light)[0], net.embed(heavy)[0])


def test_prior_is_a_distribution(ctx):
    out = run_search(ctx, KIT, 20, net=shipped())
    prior = net_prior(shipped(), out.space, out.graph)
    acts = legal(out.space, ())
    p = prior((), acts)
    assert len(p) == len(acts) and sum(p) == pytest.approx(1.0) and min(p) > 0
    assert max(p) > 1.5 / len(acts)  # not uniform: the trained prior has a preference


def test_training_reproduces_from_a_seed(ctx):
    runs = [train.self_play([ctx], KIT, rounds=1, playouts=40, epochs=2, seed=5) for _ in range(2)]
    assert gnn.to_plain(runs[0].net) == gnn.to_plain(runs[1].net)
    assert runs[0].losses == runs[1].losses and runs[0].samples[0] > 0
    again = gnn.from_plain(gnn.to_plain(runs[0].net))
    assert gnn.to_plain(again) == gnn.to_plain(runs[0].net)


def test_gnn_search_is_never_worse_than_the_anchors(ctx):
    out = run_search(ctx, KIT, 100, net=shipped())
    valued = [out.evaluator.time(plan_of(s)) for s in anchors(out.space, out.groups)]
    assert out.time <= min(valued)
