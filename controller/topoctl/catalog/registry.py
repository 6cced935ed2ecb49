"""The catalog table: name -> builder, default size parameters and the shape of one sample."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from topoctl.catalog.dense import DLRM, MLP, CandleUno
from topoctl.catalog.transformer import BertEncoder
from topoctl.catalog.vision import VGG, ResNet


@dataclass(frozen=True)
class InputSpec:
    """One model input for one sample: shape without the batch dimension, dtype, and for
    integer inputs the exclusive upper bound of the values (token ids, embedding rows)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None


@dataclass(frozen=True)
class Entry:
    """One catalog model: its nn.Module class, its input shapes per sample and a one-line
    description."""

    name: str
    cls: type[nn.Module]
    inputs: Callable[[dict], list[InputSpec]]
    doc: str

    @property
    def defaults(self) -> dict:
        """The model's default size parameters (its constructor's keyword defaults)."""
        sig = inspect.signature(self.cls.__init__)
        return {k: p.default for k, p in sig.parameters.items() if k != "self"}


ENTRIES: dict[str, Entry] = {e.name: e for e in [
    Entry("mlp", MLP, lambda p: [InputSpec((p["features"],))], "multi-layer perceptron"),
    Entry("resnet", ResNet, lambda p: [InputSpec((3, p["image"], p["image"]))],
          "ResNet-18/34/50/101/152"),
    Entry("vgg", VGG, lambda p: [InputSpec((3, p["image"], p["image"]))], "VGG-11/13/16/19"),
    Entry("bert", BertEncoder, lambda p: [InputSpec((p["seq"],), "int64", p["vocab"])],
          "BERT-style Transformer encoder"),
    Entry("dlrm", DLRM, lambda p: [InputSpec((p["dense"],)),
                                   InputSpec((p["tables"],), "int64", p["rows"])],
          "DLRM-style embedding tables + MLPs"),
    Entry("candle_uno", CandleUno,
          lambda p: [InputSpec((p["gene"],)), InputSpec((p["drug"],)),
                     InputSpec((p["fingerprint"],))], "CANDLE-Uno-style dense net"),
]}


def resolve_params(name: str, params: dict) -> dict:
    """Defaults overlaid with `params`; raises KeyError (unknown model) or ValueError naming the
    offending parameter."""
    entry = ENTRIES[name]
    full = entry.defaults
    for k, v in params.items():
        if k not in full:
            raise ValueError(f"{k}: unknown parameter of {name} (known: {', '.join(full)})")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k}: expected a positive integer, got {v!r}")
        full[k] = v
    return full


def build_model(name: str, params: dict, device: str | torch.device = "cpu") -> nn.Module:
    """Instantiate a catalog model; on device `meta` nothing is allocated (for capture)."""
    full = resolve_params(name, params)
    with torch.device(device):
        return ENTRIES[name].cls(**full)


def make_inputs(specs: list[InputSpec], batch: int,
                device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
    """Random tensors for `specs` with a leading batch dimension (floats ~ N(0, 1), integers below
    `high`)."""
    out = []
    for s in specs:
        shape = (batch, *s.shape)
        dtype = getattr(torch, s.dtype)
        if dtype.is_floating_point:
            out.append(torch.randn(shape, dtype=dtype, device=device))
        else:
            out.append(torch.randint(0, s.high or 2, shape, dtype=dtype, device=device))
    return tuple(out)


def example_inputs(name: str, params: dict, batch: int,
                   device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
    """Example inputs of catalog model `name` with `params` (defaults filled in) for `batch`
    samples."""
    full = resolve_params(name, params)
    return make_inputs(ENTRIES[name].inputs(full), batch, device)
