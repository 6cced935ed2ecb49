"""Built-in model catalog: models written with torch.nn in this project, sized by parameters.

`ENTRIES` maps a catalog name to an `Entry` (builder, default size parameters, input maker).
Sizes matching TopoOpt's workloads are the examples in `plans/*job*.yaml`.
"""

from __future__ import annotations

from topoctl.catalog.registry import ENTRIES, Entry, build_model, example_inputs, resolve_params

__all__ = ["ENTRIES", "Entry", "build_model", "example_inputs", "resolve_params"]
