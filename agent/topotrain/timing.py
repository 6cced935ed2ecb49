"""The runtime's one public entry for the controller: what it needs to time a lab rank's step
as the runtime runs it, and the runtime's CPU-cost calibration.

- `data_parallel(model, bucket_cap_mb)`: the trainer's DDP wrapping (`topotrain.workload`).
- `Stage`, `gpipe_passes`: a pipeline stage and its forward/backward passes as the pipeline
  runtime runs them (`topotrain.pipeline`); `batch_inputs`: the global batch every pipeline
  rank draws at the start of each iteration.
- `load_calibration`, `ensure_calibration`, `calibration_path`: the tree runtime's CPU costs on
  this machine (`topotrain.collectives.calibrate`), and `TCP_CONGESTION`, the congestion
  control they were measured under (the lab's hosts use the same).

The controller imports nothing else of `topotrain` (tests/unit/test_imports.py checks it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from topotrain.collectives.calibrate import (
    TCP_CONGESTION,
    calibration_path,
    ensure_calibration,
    load_calibration,
)

if TYPE_CHECKING:
    from topotrain.pipeline import Stage, batch_inputs, gpipe_passes
    from topotrain.workload import data_parallel

__all__ = ["TCP_CONGESTION", "Stage", "batch_inputs", "calibration_path", "data_parallel",
           "ensure_calibration", "gpipe_passes", "load_calibration"]


def __getattr__(name: str):
    """The torch-backed entries, imported on first use: the controller's lab, apply and status
    verbs import this module for the calibration and must not pay torch's import (1-2 s)."""
    if name == "data_parallel":
        from topotrain.workload import data_parallel  # torch: see above

        return data_parallel
    if name in ("Stage", "gpipe_passes", "batch_inputs"):
        from topotrain import pipeline  # torch: see above

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
