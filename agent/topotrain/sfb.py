"""Sufficient-factor broadcasting in the ranks: the plan's ``job.sfb`` layers (nn.Linear
modules) leave DDP's AllReduce; each rank all-gathers their factors and rebuilds their summed
gradients itself (Xie et al., UAI'16; the planner's choice: `topoctl.sfb.program`).

    from topotrain.sfb import attach_sfb
    sfb = attach_sfb(model, ["net.0", "net.2"])   # before DistributedDataParallel(model)
    loss.backward(); sfb.sync(); opt.step()

A linear layer's weight gradient is sum over samples of d x^T (x its input rows, d the loss's
gradient at its output). For a chosen layer, `attach_sfb` runs the forward through an autograd
function that keeps (x, d) for the backward and computes only the input's gradient there; its
weight and bias stop requiring gradients, so DDP leaves them out of its buckets (it reduces
only parameters that require gradients) and autograd no longer forms the rank's own weight
gradient. A zero-size anchor that requires gradients keeps the output's gradient flowing even
for a first layer whose input needs none. `SfbLayers.sync` all-gathers [x | d] of every layer
(one gloo all-gather per layer, after the backward pass and DDP's AllReduces) and sets
``weight.grad = D^T X / P`` and ``bias.grad = sum(D) / P`` from the gathered rows of all P
ranks: DDP's average, computed identically on every rank (the same rows in rank order)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass
class _Slot:
    """One layer's factors from the last backward pass: input rows and output gradient rows."""

    module: nn.Linear
    factors: tuple[torch.Tensor, torch.Tensor] | None = None


class _SfbLinear(torch.autograd.Function):
    """y = x W^T + b whose backward keeps (x, d) in the slot and returns only x's gradient."""

    @staticmethod
    def forward(ctx, x, anchor, weight, bias, slot):  # noqa: D102 - torch's protocol
        ctx.save_for_backward(x, weight)
        ctx.slot = slot
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, d):  # noqa: D102 - torch's protocol
        x, weight = ctx.saved_tensors
        ctx.slot.factors = (x.reshape(-1, x.shape[-1]), d.reshape(-1, d.shape[-1]))
        gx = d.matmul(weight) if ctx.needs_input_grad[0] else None
        return gx, None, None, None, None


@dataclass
class SfbLayers:
    """The layers a rank synchronises by SFB (in the plan's order) and the group they use."""

    slots: list[_Slot]
    group: dist.ProcessGroup | None = None
    seconds: float = 0.0  # of the last `sync`
    anchor: torch.Tensor = field(default_factory=lambda: torch.zeros(0, requires_grad=True))

    def sync(self) -> None:
        """Every layer's averaged gradient from all ranks' factors (after the backward pass)."""
        t0 = time.perf_counter()
        world = dist.get_world_size(self.group)
        for slot in self.slots:
            if slot.factors is None:
                raise RuntimeError("SFB layer without factors: sync() before its backward pass")
            x, d = slot.factors
            rows = torch.cat([x.detach(), d.detach()], dim=1).contiguous()
            every = [torch.empty_like(rows) for _ in range(world)]
            dist.all_gather(every, rows, group=self.group)
            both = torch.cat(every)
            xs, ds = both[:, : x.shape[1]], both[:, x.shape[1]:]
            mod = slot.module
            mod.weight.grad = ds.t().matmul(xs).div_(world)
            if mod.bias is not None:
                mod.bias.grad = ds.sum(0).div_(world)
            slot.factors = None
        self.seconds = time.perf_counter() - t0


class SfbError(ValueError):
    """The plan's ``job.sfb`` names a module the model does not have as an nn.Linear."""


def attach_sfb(model: nn.Module, names: list[str],
               group: dist.ProcessGroup | None = None) -> SfbLayers:
    """Route the named nn.Linear modules of `model` through SFB; call before wrapping it in
    DDP. SfbError naming the plan's ``job.sfb[i]`` that is missing or not an nn.Linear."""
    mods = dict(model.named_modules())
    layers = SfbLayers([], group)
    for i, name in enumerate(names):
        mod = mods.get(name)
        if not isinstance(mod, nn.Linear):
            kind = "no module" if mod is None else f"a {type(mod).__name__}"
            raise SfbError(f"job.sfb[{i}]: {name!r} is {kind} of the model, not an nn.Linear "
                           "(SFB rebuilds only linear layers' gradients)")
        slot = _Slot(mod)
        for p in mod.parameters(recurse=False):
            p.requires_grad_(False)  # out of DDP's buckets; SFB sets its gradient
        mod.forward = _forward(slot, layers.anchor)
        layers.slots.append(slot)
    return layers


def _forward(slot: _Slot, anchor: torch.Tensor):
    """The chosen layer's forward through `_SfbLinear`."""
    mod = slot.module

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _SfbLinear.apply(x, anchor, mod.weight, mod.bias, slot)
    return forward
