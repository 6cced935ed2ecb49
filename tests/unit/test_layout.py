"""The plan layout every strategy's plan passes (`topoctl.sim.layout`): what each device holds
(ZeRO's accounting, `sim.memory.footprint`), the refusal that names the device, what it needs
by kind and what it has, and explain's memory line, over plain data."""

from __future__ import annotations

import pytest

from topoctl.render.explain import layout_lines, memory_line
from topoctl.sim.layout import (
    OpBytes,
    collectives,
    group_label,
    layout,
    layout_doc,
    overflows,
)
from topoctl.sim.memory import footprint

GB = 1e9
# a three-op model in bf16: 1e9 parameters (2 GB of weights), 3 GB of activations at batch 4
OPS = [OpBytes("embed", 0.5 * GB, 1 * GB), OpBytes("view", 0, 0),
       OpBytes("head", 1.5 * GB, 2 * GB)]


def two_hosts(n: int) -> tuple[dict, dict]:
    """Devices and global ranks of two hosts of `n` devices each."""
    devices = {h: [f"{h}/g{i}" for i in range(n)] if n > 1 else [h] for h in ("h0", "h1")}
    ranks = {"h0": list(range(n)), "h1": list(range(n, 2 * n))}
    return devices, ranks


def test_data_parallel_devices_hold_the_whole_model():
    devices, ranks = two_hosts(4)
    groups = layout(OPS, 4, 2, {"algorithm": "ring"}, devices, ranks,
                    {"h0": "H100", "h1": "H100"}, {"h0": 80 * GB, "h1": 80 * GB})
    assert len(groups) == 1
    g = groups[0]
    want = footprint(1e9, 2, 3 * GB, optimiser="adam", mixed_precision=True)
    assert g.footprint == want
    assert want.total == pytest.approx(16 * GB + 3 * GB)  # 16 bytes per parameter + activations
    assert dict(g.degrees) == {"data": 8, "tensor": 1, "pipeline": 1, "fsdp": 1}
    assert g.fits and overflows(groups) == []
    assert group_label(g.devices) == "h0..h1/g0..g3"


def test_refusal_names_devices_need_by_kind_and_capacity():
    devices, ranks = two_hosts(2)
    groups = layout(OPS, 4, 2, {"algorithm": "ring"}, devices, ranks,
                    {"h0": "V100", "h1": "P100"}, {"h0": 32 * GB, "h1": 16 * GB})
    over = overflows(groups)
    # the V100s hold 19 GB, the P100s do not: one sentence for the P100 host's devices
    assert over == ["h1/g0..g1 (2 x P100, 16 GB each): needs 19 GB (parameters 2 GB, "
                    "gradients 2 GB, optimiser 12 GB, activations 3 GB) per device, has 16 GB"]


def test_unknown_capacity_is_not_refused():
    devices, ranks = two_hosts(1)
    groups = layout(OPS, 4, 2, {"algorithm": "ring"}, devices, ranks,
                    {"h0": "CPU", "h1": "CPU"}, {"h0": None, "h1": None})
    assert overflows(groups) == [] and groups[0].capacity is None
    assert "unknown capacity (not checked)" in memory_line(
        layout_doc(groups, [])["groups"][0]["memory"])


def test_batch_shares_set_each_devices_activations():
    devices, ranks = two_hosts(1)
    coll = {"algorithm": "ring", "shares": [6, 2]}  # samples per global rank
    groups = layout(OPS, 4, 2, coll, devices, ranks, {"h0": "A100", "h1": "A100"},
                    {"h0": 80 * GB, "h1": 80 * GB})
    assert [g.footprint.activations for g in groups] == [4.5 * GB, 1.5 * GB]


def test_pipeline_stage_holds_its_ops_and_every_micro_batch():
    devices = {h: [h] for h in ("h0", "h1", "h2")}
    ranks = {"h0": [0], "h1": [1], "h2": [2]}
    coll = {"algorithm": "pipeline", "microbatches": 4, "micro_batch": 1,
            "stages": [{"hosts": ["h0"], "ops": ["embed", "view"]},
                       {"hosts": ["h1", "h2"], "ops": ["head"]}]}
    kinds = dict.fromkeys(devices, "P100")
    groups = layout(OPS, 4, 4, coll, devices, ranks, kinds, dict.fromkeys(devices, 16 * GB))
    assert [(g.stage, g.devices) for g in groups] == [(0, ("h0",)), (1, ("h1", "h2"))]
    # fp32: 16 bytes per parameter; a quarter of the batch per micro-batch, 4 in flight
    assert groups[0].footprint == footprint(0.5 * GB / 4, 4, 1 * GB / 4, microbatches=4)
    assert groups[1].footprint.total == pytest.approx(4 * 1.5 * GB + 2 * GB)
    assert dict(groups[1].degrees) == {"data": 2, "tensor": 1, "pipeline": 2, "fsdp": 1}


def test_explain_memory_line_is_the_checks_footprint():
    devices, ranks = two_hosts(2)
    groups = layout(OPS, 4, 2, {"algorithm": "ring"}, devices, ranks,
                    {"h0": "H100", "h1": "H100"}, {"h0": 80 * GB, "h1": 80 * GB})
    doc = {"metadata": {"layout": layout_doc(groups, collectives(
        [("ring-allreduce", 4, 3 * GB), ("ring-allreduce", 4, 1 * GB)]))}}
    lines = layout_lines(doc)
    fp = groups[0].footprint
    assert f"    memory per device: {fp.describe()} of 80 GB (24%)" in lines
    assert "  h0..h1/g0..g1: 4 x H100, data 4, tensor 1, pipeline 1, fsdp 1" in lines
    assert "  per iteration: 2 x ring-allreduce (up to 4 members), 4 GB sent" in lines


@pytest.mark.parametrize("names, want", [
    (["h0", "h1", "h2", "h3"], "h0..h3"),
    (["h0", "h1"], "h0..h1"),
    (["h0/g0", "h0/g1", "h2/g0", "h2/g1"], "h0/g0..g1, h2/g0..g1"),
    (["a", "h1", "h2", "h3", "h5"], "a, h1..h3, h5"),
    ([f"h{i}/g{j}" for i in range(2) for j in range(8)] + ["h2/g0"], "h0..h1/g0..g7, h2/g0"),
    (["h0/g0", "h0/g2"], "h0/g0, g2"),
])
def test_group_label(names, want):
    assert group_label(names) == want
