"""bench.sync.sfb_crossover's helper: the hidden fully connected layers it forces onto SFB (every
linear layer but the classifier), with their widths."""

from __future__ import annotations

from bench.common import PLANS
from bench.sync.sfb_crossover import hidden_layers
from topoctl.planner import prepare
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import parse_job


def test_hidden_layers_of_the_lab_mlp():
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "x",
                     "model": {"catalog": "mlp", "params": {"layers": 4, "hidden": 1024}},
                     "batch": {"global": 64}, "cost": {"method": "roofline"},
                     "strategies": ["baseline"]})
    ctx = prepare(load_cluster(PLANS / "hetero8-cluster.yaml"), job, use_cache=False)
    assert [(m, n) for _op, m, n in hidden_layers(ctx)] == [(784, 1024)] + [(1024, 1024)] * 3
