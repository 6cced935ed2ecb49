"""`topoctl explain --png` on a TopoOpt plan: links coloured by the TotientPerms stride they
come from (model-parallel matching and fill links styled apart), with a legend; checked on the
pixels of the written PNG."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml
from matplotlib import colors

from topoctl.cli import main
from topoctl.planner import make_plan
from topoctl.render.drawing import STRIDE_COLOURS, draw_png, link_styles
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

CLUSTER = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "tpd",
           "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "cpu"}},
           "hosts": [{"name": f"h{i}", "nics": [{"name": f"eth{k}"} for k in range(4)]}
                     for i in range(10)], "fabric": {"kind": "direct", "mtu": 9000, "links": []}}
JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "mlp",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 256, "features": 64,
                                              "classes": 10}},
       "batch": {"global": 60}, "strategies": ["topoopt"], "sync": {"bucket": "1MB"},
       "cost": {"method": "roofline"}}


@pytest.fixture(scope="module")
def plan_doc():
    doc, _, _ = make_plan(parse_cluster(CLUSTER), parse_job(JOB), use_cache=False)
    return doc


def _pixels(path) -> set[tuple[int, int, int]]:
    import matplotlib.image

    img = matplotlib.image.imread(str(path))[:, :, :3]
    return {tuple(int(round(255 * v)) for v in px) for px in np.unique(
        img.reshape(-1, 3), axis=0)}


def _rgb(name: str) -> tuple[int, int, int]:
    return tuple(int(round(255 * v)) for v in colors.to_rgb(name))


def test_link_kinds_name_the_stride_of_every_cable(plan_doc):
    topo = plan_doc["metadata"]["collective"]["topology"]
    kinds = topo["link_kinds"]
    assert topo["strides"] == [1, 3] and len(kinds) == len(plan_doc["fabric"]["links"]) == 20
    pos = {h: i for i, h in enumerate(plan_doc["hosts"])}
    for ln, k in zip(plan_doc["fabric"]["links"], kinds, strict=True):
        p = int(k.split(":")[1])  # every cable of this fabric is on a ring
        d = (pos[ln["b"].split(":")[0]] - pos[ln["a"].split(":")[0]]) % 10
        assert d in (p, 10 - p)
    assert sorted(set(kinds)) == ["ring:1", "ring:3"] and kinds.count("ring:1") == 10


def test_png_colours_links_by_stride_with_a_legend(plan_doc, tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan_doc, sort_keys=False))
    png = tmp_path / "fabric.png"
    assert main(["explain", str(path), "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    seen = _pixels(png)
    # one colour per stride, the first two of the palette; no plain grey link colour left
    assert {_rgb(STRIDE_COLOURS[0]), _rgb(STRIDE_COLOURS[1])} <= seen
    assert _rgb(STRIDE_COLOURS[2]) not in seen
    styles = link_styles(plan_doc)
    assert {s["label"] for s in styles} == {"ring stride 1", "ring stride 3"}


def test_matching_and_fill_links_are_styled_apart(plan_doc, tmp_path):
    doc = copy.deepcopy(plan_doc)
    kinds = doc["metadata"]["collective"]["topology"]["link_kinds"]
    kinds[-1], kinds[-2] = "mp", "fill"
    styles = link_styles(doc)
    assert styles[-1]["linestyle"] == "--" and styles[-1]["label"] == "model-parallel matching"
    assert styles[-2]["linestyle"] == ":" and styles[-2]["color"] == "0.6"
    draw_png(doc, str(tmp_path / "a.png"))
    draw_png(plan_doc, str(tmp_path / "b.png"))
    assert (tmp_path / "a.png").read_bytes() != (tmp_path / "b.png").read_bytes()
    assert _rgb("0.6") in _pixels(tmp_path / "a.png")  # the fill link's grey


def test_older_plans_without_kinds_are_inferred_from_strides(plan_doc):
    doc = copy.deepcopy(plan_doc)
    kinds = doc["metadata"]["collective"]["topology"].pop("link_kinds")
    assert [s["label"] for s in link_styles(doc)] == [
        f"ring stride {k.split(':')[1]}" for k in kinds]
    base = copy.deepcopy(plan_doc)
    base["metadata"]["collective"].pop("topology")
    assert link_styles(base) is None  # not a TopoOpt plan: drawn as before
