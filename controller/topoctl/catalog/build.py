"""Catalog models and their inputs as tensors (imports torch; the table itself,
`topoctl.catalog.registry`, does not)."""

from __future__ import annotations

import torch
from torch import nn

from topoctl.catalog.registry import ENTRIES, InputSpec, resolve_params


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
