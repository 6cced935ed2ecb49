"""bench/placement/search.py scores placements on the planner's GPipe iteration model
(`pipeline.gpipe.pipeline_tasks`), not a model of its own: a placement's devices become stages
in the order of the graph between them, a cyclic placement is no pipeline (infinity), and an
iteration takes at least every micro-batch's compute on its busiest stage."""

from __future__ import annotations

import math

import pytest

from bench.placement import search as ps
from topoctl.graph.coarsen import from_opgraph
from topoctl.placement.build import build_problem
from topoctl.sim.network import star

MICRO = 4


@pytest.fixture(scope="module")
def setup():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(ps.MODELS, "mlp", ("mlp", {"layers": 3, "hidden": 64}, 8))
        ctx = ps.context("mlp", 2)
    hosts = ps.devices(2)
    net = star(hosts, ps.LINK)
    costs = ctx.costs["A100"]
    fine = from_opgraph(ctx.graph, costs)
    op_cost = {h: {o: c.fwd + c.bwd for o, c in ctx.costs[ps.kinds(2)[h]].items()}
               for h in hosts}
    p = build_problem(fine, [[h] for h in hosts], op_cost, {h: 1e12 for h in hosts}, net,
                      MICRO)
    return ctx, fine, p, net


def test_a_cyclic_placement_is_no_pipeline(setup):
    ctx, fine, p, net = setup
    n = len(p.nodes)
    assign = [0] * n
    assign[n // 2] = 1  # d0 -> d1 -> d0: the devices form a cycle
    assert ps.makespan(ctx, fine, p, assign, net, MICRO) == math.inf


@pytest.mark.parametrize("split", ["none", "half"])
def test_an_iteration_takes_every_micro_batch_on_the_busiest_stage(setup, split):
    ctx, fine, p, net = setup
    n = len(p.nodes)
    assign = [0] * n if split == "none" else [0] * (n // 2) + [1] * (n - n // 2)
    t = ps.makespan(ctx, fine, p, assign, net, MICRO)
    busiest = max(sum(p.cost[i][d] for i in range(n) if assign[i] == d) for d in set(assign))
    assert math.isfinite(t) and t >= MICRO * busiest * (1 - 1e-9)
