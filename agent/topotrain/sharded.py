"""Sharded parallelism of a decoder LM (`topoctl.catalog.lm`) inside the ranks: tensor
parallelism over a device group, FSDP2 across the data-parallel ranks, and both on a 2-D mesh.

- **Even tensor parallelism** (Megatron-LM's layout, Shoeybi et al. 2019) with torch's own
  DTensor: `parallelize_module` with ColwiseParallel on q, k, v and fc1 and RowwiseParallel on
  the attention output and fc2, so each device holds heads/t heads and ffn/t of the MLP; per
  block two all-reduces of the activations forward and two backward.
- **Uneven tensor parallelism** (HAP's sharding ratios, EuroSys'24: a faster device takes
  more): DTensor's `Shard` placement cuts a dimension into equal pieces only, so the same
  layout is written out with explicit split sizes (`UnevenColumn`, `UnevenRow`): whole heads
  and MLP columns per device as the plan says, the all-reduces by autograd functions over the
  group. Same communication as the even case.
- **FSDP** (ZeRO-3, Rajbhandari et al. SC'20) with FSDP2's `fully_shard`, one unit per block
  plus the root: parameters sharded over the data-parallel ranks, gathered per block for the
  forward and again for the backward, gradients reduce-scattered and averaged.
- **Tensor x data parallelism**: a (dp, tp) DeviceMesh, tensor parallelism on its `tp` rows,
  FSDP (or plain averaging of the gradients, `fsdp=False`) on its `dp` columns.

All of it runs over gloo on CPUs here (all_gather_into_tensor, reduce_scatter_tensor)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["UnevenColumn", "UnevenRow", "average_gradients", "shard_lm", "split_sizes",
           "uneven_tensor_parallel"]


def split_sizes(total: int, weights: Sequence[float], unit: int = 1) -> list[int]:
    """`total` cut in whole multiples of `unit` in proportion to `weights` (largest
    remainder; every device at least one unit). The plan's sharding ratios become heads (unit
    head_dim) and MLP columns this way."""
    units = total // unit
    if units < len(weights):
        raise ValueError(f"{units} units cannot be shared by {len(weights)} devices")
    raw = [units * w / sum(weights) for w in weights]
    sizes = [max(1, int(x)) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - int(raw[i])), i))
    k = 0
    while sum(sizes) < units:
        sizes[order[k % len(order)]] += 1
        k += 1
    while sum(sizes) > units:
        i = max(range(len(sizes)), key=lambda j: (sizes[j] - raw[j], -j))
        sizes[i] -= 1
    return [s * unit for s in sizes]


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; the gradient summed over the group backward (Megatron's `f`)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _SumOverGroup(torch.autograd.Function):
    """The partial outputs summed over the group forward; identity backward (Megatron's `g`)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _slice_of(sizes: Sequence[int], index: int) -> slice:
    start = sum(sizes[:index])
    return slice(start, start + sizes[index])


class UnevenColumn(nn.Module):
    """Rows `sizes[index]` of a Linear's weight (output features): a column-parallel layer
    whose input gradient is summed over the group."""

    def __init__(self, linear: nn.Linear, sizes: Sequence[int], index: int, group) -> None:
        super().__init__()
        part = _slice_of(sizes, index)
        self.weight = nn.Parameter(linear.weight.detach()[part].clone())
        self.bias = nn.Parameter(linear.bias.detach()[part].clone())
        self.group = group

    def forward(self, x):
        return nn.functional.linear(_CopyToGroup.apply(x, self.group), self.weight, self.bias)


class UnevenRow(nn.Module):
    """Columns `sizes[index]` of a Linear's weight (input features): a row-parallel layer
    whose partial outputs are summed over the group; the bias is added once, after the sum."""

    def __init__(self, linear: nn.Linear, sizes: Sequence[int], index: int, group) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach()[:, _slice_of(sizes, index)].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())
        self.group = group

    def forward(self, x):
        partial = nn.functional.linear(x, self.weight)
        return _SumOverGroup.apply(partial, self.group) + self.bias


def uneven_tensor_parallel(model: nn.Module, weights: Sequence[float], group=None) -> nn.Module:
    """Split every block of the LM `model` over `group` (default: the world) in proportion to
    `weights` (one per group rank): whole heads of q/k/v/out, columns of fc1/fc2. In place;
    returns `model`. The LayerNorms, embeddings and head stay replicated (their gradients are
    the same on every rank of the group)."""
    index = dist.get_rank(group)
    for block in model.blocks:
        attn = block.attn
        heads = split_sizes(attn.q.out_features, weights, attn.head_dim)
        for name in ("q", "k", "v"):
            setattr(attn, name, UnevenColumn(getattr(attn, name), heads, index, group))
        attn.out = UnevenRow(attn.out, heads, index, group)
        cols = split_sizes(block.fc1.out_features, weights)
        block.fc1 = UnevenColumn(block.fc1, cols, index, group)
        block.fc2 = UnevenRow(block.fc2, cols, index, group)
    return model


def _tp_plan(model: nn.Module) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for i in range(len(model.blocks)):
        for name in ("attn.q", "attn.k", "attn.v", "fc1"):
            plan[f"blocks.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.out", "fc2"):
            plan[f"blocks.{i}.{name}"] = RowwiseParallel()
    return plan


def shard_lm(model: nn.Module, dp: int, tp: int, fsdp: bool) -> tuple[nn.Module, object]:
    """Lay the LM `model` out over a (dp, tp) mesh of the world's ranks (rank = i*tp + j: the
    tp ranks of a replica are consecutive, so a host's ranks form the tensor-parallel group):
    DTensor tensor parallelism on the `tp` dimension, then FSDP2 on `dp` (`fsdp`), else the
    model as is (the caller averages gradients over the dp group). Returns (model, mesh)."""
    from torch.distributed.device_mesh import init_device_mesh

    if dp * tp != dist.get_world_size():
        raise ValueError(f"dp {dp} x tp {tp} is not the world size {dist.get_world_size()}")
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    if tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh["tp"], _tp_plan(model))
    if fsdp and dp > 1:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model, mesh


def average_gradients(model: nn.Module, group) -> None:
    """Plain data parallelism beside tensor parallelism: every gradient (its local shard for a
    DTensor) averaged over `group`, the ranks holding the same shard."""
    n = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is None:
            continue
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(g, group=group)
        g.div_(n)
