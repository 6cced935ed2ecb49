"""torch.fx capture: FLOPs and bytes against closed forms, edges, gradients, factories."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from topoctl.catalog.registry import InputSpec
from topoctl.graph.capture import CaptureError, capture, capture_catalog, capture_factory
from topoctl.graph.ops import OpGraph


class Tiny(nn.Module):
    def __init__(self, d_in: int = 12, d_hidden: int = 20, d_out: int = 6):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(d_hidden, d_out, bias=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def make_tiny(width: int = 20) -> nn.Module:
    return Tiny(d_hidden=width)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):
        return self.out(self.emb(ids))


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
            return x
        return -x


def test_linear_flops_bytes_and_edges():
    b = 5
    g = capture(Tiny().to("meta"), (torch.randn(b, 12, device="meta"),), "tiny")
    ops = g.by_name()
    assert ops["fc1"].flops == 2 * b * 12 * 20 + b * 20
    assert ops["fc2"].flops == 2 * b * 20 * 6
    assert ops["act"].flops == b * 20
    assert ops["fc1"].param_bytes == (12 * 20 + 20) * 4
    assert ops["fc1"].out_bytes == b * 20 * 4 and ops["act"].in_bytes == b * 20 * 4
    assert ops["fc1"].bwd_flops == 2 * ops["fc1"].flops and ops["act"].bwd_flops == b * 20
    assert ("fc1", "act", b * 20 * 4) in g.edges() and ("act", "fc2", b * 20 * 4) in g.edges()
    assert g.param_bytes == sum(p.numel() * 4 for p in Tiny().parameters())


def test_gradients_come_in_backward_order_with_their_bytes():
    g = capture(Tiny(), (torch.randn(2, 12),), "tiny")
    order = g.gradient_order()
    assert [p for _, p, _ in order] == ["fc2.weight", "fc1.bias", "fc1.weight"]
    assert dict((p, b) for _, p, b in order) == {"fc2.weight": 480, "fc1.bias": 80,
                                                  "fc1.weight": 960}


def test_tied_weights_count_once():
    g = capture(Tied(), (torch.zeros(3, 7, dtype=torch.long),), "tied")
    assert g.param_bytes == 10 * 4 * 4


def test_conv_and_matmul_flops():
    g = capture_catalog("resnet", {"depth": 18, "width": 8, "image": 32}, 2)
    conv = g.by_name()["stem_0"]
    assert conv.kind == "conv2d" and conv.out_shape == (2, 8, 16, 16)
    assert conv.flops == 2 * (2 * 8 * 16 * 16) * 3 * 7 * 7
    bert = capture_catalog("bert", {"layers": 1, "hidden": 32, "heads": 4, "seq": 16,
                                    "vocab": 50}, 3)
    mm = [o for o in bert.ops if o.kind == "matmul"]
    assert mm[0].out_shape == (3, 4, 16, 16) and mm[0].flops == 2 * 3 * 4 * 16 * 16 * 8


def test_fp16_capture_halves_parameter_bytes():
    a = capture_catalog("mlp", {"hidden": 64}, 4, "float32")
    b = capture_catalog("mlp", {"hidden": 64}, 4, "float16")
    assert b.param_bytes * 2 == a.param_bytes and b.dtype_bytes == 2


def test_flops_scale_with_batch_and_roundtrip():
    a = capture_catalog("bert", {"layers": 2, "hidden": 64, "heads": 4, "seq": 16}, 2)
    b = capture_catalog("bert", {"layers": 2, "hidden": 64, "heads": 4, "seq": 16}, 6)
    assert b.flops == pytest.approx(3 * a.flops)
    assert b.param_bytes == a.param_bytes
    assert OpGraph.from_dict(a.to_dict()).ops == a.ops


def test_factory_capture_and_errors():
    g = capture_factory("tests.unit.test_graph:make_tiny", [InputSpec((12,))], 4,
                        kwargs={"width": 7})
    assert g.by_name()["fc1"].out_shape == (4, 7)
    with pytest.raises(CaptureError, match="cannot import"):
        capture_factory("no_such_pkg.mod:f", [InputSpec((1,))], 1)
    with pytest.raises(CaptureError, match="no callable"):
        capture_factory("tests.unit.test_graph:nothing", [InputSpec((1,))], 1)
    with pytest.raises(CaptureError, match="cannot trace"):
        capture(Branchy(), (torch.randn(2, 2),), "branchy")
    with pytest.raises(CaptureError, match="unknown model"):
        capture_catalog("nope", {}, 1)
