"""Operator fusion on the planner's side: regions chosen as module subtrees
(`topoctl.disco.fusion.regions`), `fused_costs` per option (a region's cost on its anchor, the
roofline's removed launches and traffic), the plan field's contract (`topocontract.fusion`)
and the cost models' fitting (`topoctl.disco.fusion.model`, `topoctl.disco.fusion.gnn`)."""

from __future__ import annotations

import pytest

from topocontract.fusion import FusionPlan, parse_fusion, region_of
from topoctl.disco.fusion.costs import fused_costs, fusion_options, fusion_plan
from topoctl.disco.fusion.model import ConstantModel, LaunchModel, relative_errors
from topoctl.disco.fusion.regions import choose_regions, modules_with_ops, op_regions, region_ops
from topoctl.graph.capture import capture_catalog
from topoctl.graph.cost import roofline_costs, totals
from topoctl.graph.devices import DEVICES

CPU = DEVICES["CPU"]
RESNET = ({"depth": 18, "width": 16, "image": 32, "classes": 10}, 8)
DLRM = ({"tables": 4, "rows": 1000, "dim": 16, "bottom": 64, "top": 128}, 32)


@pytest.fixture(scope="module")
def resnet():
    g = capture_catalog("resnet", *RESNET)
    return g, roofline_costs(g, CPU)


def test_groups_are_blocks_and_never_an_uncalled_container(resnet):
    g, c = resnet
    assert choose_regions(g, c) == ("stem", *(f"layers.{i}" for i in range(8)))
    dl = capture_catalog("dlrm", *DLRM)
    regions = choose_regions(dl, roofline_costs(dl, CPU))
    assert regions == ("bottom", "top")  # `emb` is a ModuleList: never called as a module
    assert "emb" not in modules_with_ops(dl)
    assert region_of("layers.3.conv1", ("layers", "layers.3")) == "layers.3"
    assert region_of("fc", ("layers.3",)) is None


def test_none_is_the_costs_and_whole_charges_the_last_op(resnet):
    g, c = resnet
    assert fused_costs(g, c, "none") == c
    whole = fused_costs(g, c, "whole", device=CPU)
    assert set(whole) == set(c)
    last = [o.name for o in g.ops if not o.is_view and o.kind != "output"][-1]
    assert [n for n, v in whole.items() if v.fwd or v.bwd] == [last]
    # fusion removes launches and internal traffic: never slower on the roofline
    assert totals(whole)[0] < totals(c)[0] and totals(whole)[1] < totals(c)[1]
    groups = fused_costs(g, c, "groups", device=CPU)
    anchors = {n for n, v in groups.items() if v.fwd} & set(op_regions(g, choose_regions(g, c)))
    assert len(anchors) == 9  # one per region
    assert totals(whole)[0] <= totals(groups)[0] <= totals(c)[0]
    assert set(fusion_options(g, c, device=CPU)) == {"none", "groups", "whole"}


def test_the_roofline_removes_launches_and_internal_traffic():
    g = capture_catalog("mlp", {"layers": 2, "hidden": 64, "features": 32}, 4)
    c = roofline_costs(g, CPU)
    compute = [o for o in g.ops if not o.is_view]
    fused = fused_costs(g, c, "whole", device=CPU)
    saved = totals(c)[0] - totals(fused)[0]
    # tiny layers: launch-bound, so fusing n ops saves about n - 1 launches
    assert saved == pytest.approx((len(compute) - 1) * CPU.launch, rel=0.05)


def test_learned_costs_scale_a_region_by_the_predicted_ratio(resnet):
    g, c = resnet
    half = fused_costs(g, c, "groups", predict=lambda ops, t: 0.5 * t)
    member = op_regions(g, choose_regions(g, c))
    inside = sum(c[n].fwd + c[n].bwd for n in member)
    assert sum(half[n].fwd + half[n].bwd for n in member) == pytest.approx(inside / 2)
    with pytest.raises(ValueError, match="fusion option 'fast'"):
        fused_costs(g, c, "fast")


def test_the_plan_field_round_trips(resnet):
    g, c = resnet
    plan = fusion_plan(g, c, "groups")
    assert parse_fusion(plan.to_dict()) == plan
    assert parse_fusion({"mode": "whole"}) == FusionPlan("whole", ("",))
    assert parse_fusion({}) == FusionPlan()
    for doc, msg in [({"mode": "fast"}, "job.fusion.mode"),
                     ({"mode": "groups", "regions": ["a", "a.b"]}, "'a.b' lies inside 'a'"),
                     ({"mode": "whole", "regions": ["x"]}, "job.fusion.regions"),
                     ({"mode": "none", "budget_s": -1}, "job.fusion.budget_s"),
                     ({"mode": "none", "regiosn": []}, "job.fusion.regiosn")]:
        with pytest.raises(ValueError, match=msg.replace(".", r"\.")):
            parse_fusion(doc)


def _samples(g, regions, r=0.8, a=2e-6, b=1e-10):
    out = []
    for i, reg in enumerate(regions):
        ops = region_ops(g, reg)
        eager = 1e-3 * (1 + i)
        model = LaunchModel(r, a, b)
        out.append({"ops": ops, "eager_s": eager, "fused_s": model.predict(ops, eager)})
    return out


def test_the_launch_model_recovers_its_coefficients(resnet):
    g, _ = resnet
    samples = _samples(g, modules_with_ops(g))
    fit = LaunchModel.fit(samples)
    assert (fit.r, fit.a, fit.b) == pytest.approx((0.8, 2e-6, 1e-10), rel=1e-3)
    assert max(relative_errors(fit.predict, samples)) < 1e-6
    assert max(relative_errors(ConstantModel.fit(samples).predict, samples)) > 0.01


def test_the_gnn_learns_the_ratio(resnet):
    torch = pytest.importorskip("torch")
    from topoctl.disco.fusion.gnn import GnnModel

    torch.set_num_threads(1)
    g, _ = resnet
    samples = _samples(g, modules_with_ops(g))
    before = relative_errors(GnnModel.fit(samples, epochs=0).predict, samples)
    after = relative_errors(GnnModel.fit(samples, epochs=150).predict, samples)
    assert sum(after) < 0.5 * sum(before)
