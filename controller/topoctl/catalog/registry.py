"""The catalog table: name -> model class (imported when first used), default size parameters
and the shape of one sample. Importing this module does not import torch (1.2 s of CPU): the
CLI's verbs that only read a job or a plan stay quick; `topoctl.catalog.build` makes the models
and their inputs."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class InputSpec:
    """One model input for one sample: shape without the batch dimension, dtype, and for
    integer inputs the exclusive upper bound of the values (token ids, embedding rows)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None


@dataclass(frozen=True)
class Entry:
    """One catalog model: where its nn.Module class lives (``module:Class``), its input shapes
    per sample and a one-line description."""

    name: str
    factory: str
    inputs: Callable[[dict], list[InputSpec]]
    doc: str

    @property
    def cls(self) -> type:
        """The model's nn.Module class (its module, and torch, imported now)."""
        module, _, attr = self.factory.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def defaults(self) -> dict:
        """The model's default size parameters (its constructor's keyword defaults)."""
        sig = inspect.signature(self.cls.__init__)
        return {k: p.default for k, p in sig.parameters.items() if k != "self"}


ENTRIES: dict[str, Entry] = {e.name: e for e in [
    Entry("mlp", "topoctl.catalog.dense:MLP",
          lambda p: [InputSpec((p["features"],))], "multi-layer perceptron"),
    Entry("resnet", "topoctl.catalog.vision:ResNet",
          lambda p: [InputSpec((3, p["image"], p["image"]))], "ResNet-18/34/50/101/152"),
    Entry("vgg", "topoctl.catalog.vision:VGG",
          lambda p: [InputSpec((3, p["image"], p["image"]))], "VGG-11/13/16/19"),
    Entry("bert", "topoctl.catalog.transformer:BertEncoder",
          lambda p: [InputSpec((p["seq"],), "int64", p["vocab"])],
          "BERT-style Transformer encoder"),
    Entry("lm", "topoctl.catalog.lm:DecoderLM",
          lambda p: [InputSpec((p["seq"],), "int64", p["vocab"])],
          "decoder-only transformer LM (GPT-style; tensor-parallel layout)"),
    Entry("dlrm", "topoctl.catalog.dense:DLRM",
          lambda p: [InputSpec((p["dense"],)), InputSpec((p["tables"],), "int64", p["rows"])],
          "DLRM-style embedding tables + MLPs"),
    Entry("candle_uno", "topoctl.catalog.dense:CandleUno",
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
