"""Built-in models: build on the meta device, published parameter counts, input shapes."""

from __future__ import annotations

import pytest
import torch

from topoctl.catalog import ENTRIES, build_model, example_inputs, resolve_params


def n_params(name: str, params: dict) -> int:
    return sum(p.numel() for p in build_model(name, params, "meta").parameters())


def test_published_sizes():
    # ResNet-50 25.56M, VGG-16 138.36M (torchvision), BERT-base encoder 85M + embeddings
    assert n_params("resnet", {"depth": 50}) == pytest.approx(25.56e6, rel=0.01)
    assert n_params("vgg", {"depth": 16}) == pytest.approx(138.36e6, rel=0.01)
    h, layers, vocab, seq = 768, 12, 30522, 128
    per_layer = 4 * h * h + 4 * h + 2 * (4 * h * h) + 4 * h + h + 4 * h
    expected = layers * per_layer + vocab * h + seq * h + 2 * h + h * vocab + vocab
    assert n_params("bert", {}) == expected


def test_lm_parameter_count_and_sizes():
    """12 h^2 + 13 h per block (q, k, v, out; fc1, fc2 at 4h; two LayerNorms), embeddings,
    final LayerNorm and the untied head; the 7b size is about 7 B parameters."""
    layers, h, seq, vocab = 2, 64, 32, 256
    per_block = 4 * (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h) + 4 * h
    expected = layers * per_block + vocab * h + seq * h + 2 * h + h * vocab + vocab
    assert n_params("lm", {}) == expected
    from topoctl.catalog.lm import SIZES
    layers, hidden, _ = SIZES["7b"]
    assert 6.4e9 < layers * (12 * hidden * hidden + 13 * hidden) + 2 * 32000 * hidden < 7.2e9


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_entry_runs_a_tiny_batch(name):
    small = {"mlp": {"hidden": 16}, "resnet": {"depth": 18, "width": 8, "image": 32},
             "vgg": {"depth": 11, "width": 8, "image": 32, "hidden": 32},
             "bert": {"layers": 1, "hidden": 32, "heads": 2, "seq": 8, "vocab": 50},
             "lm": {"layers": 1, "hidden": 32, "heads": 2, "seq": 8, "vocab": 50},
             "dlrm": {"tables": 3, "rows": 20, "dim": 8, "bottom": 16, "top": 16},
             "candle_uno": {"tower": 16, "hidden": 16, "gene": 10, "drug": 12,
                            "fingerprint": 14}}[name]
    m = build_model(name, small)
    out = m(*example_inputs(name, small, 2))
    assert out.shape[0] == 2 and torch.isfinite(out).all()


def test_resolve_params_rejects_unknown_and_bad_values():
    with pytest.raises(ValueError, match="unknown parameter"):
        resolve_params("mlp", {"depth": 3})
    with pytest.raises(ValueError, match="positive integer"):
        resolve_params("mlp", {"layers": True})
    with pytest.raises(KeyError):
        resolve_params("nope", {})
