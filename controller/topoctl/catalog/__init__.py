"""Built-in model catalog: models written with torch.nn in this project, sized by parameters.

`ENTRIES` maps a catalog name to an `Entry` (where its class lives, default size parameters,
input shapes); `build_model` and `example_inputs` (`topoctl.catalog.build`) make the model and
its inputs, importing torch on first use so that reading a job stays quick.
Sizes matching TopoOpt's workloads are the examples in `plans/*job*.yaml`.
"""

from __future__ import annotations

import importlib
from typing import Any

from topoctl.catalog.registry import ENTRIES, Entry, resolve_params

__all__ = ["ENTRIES", "Entry", "build_model", "example_inputs", "resolve_params"]
_BUILD = {"build_model", "example_inputs", "make_inputs"}  # in topoctl.catalog.build (torch)


def __getattr__(name: str) -> Any:
    """`build_model` and `example_inputs`, imported (with torch) when first asked for."""
    if name in _BUILD:
        return getattr(importlib.import_module("topoctl.catalog.build"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
