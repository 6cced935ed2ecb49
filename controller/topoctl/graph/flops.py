"""FLOP counts per op kind from shapes (a multiply-add counts 2), forward and backward.

Conventions (as in fvcore / DeepSpeed's profiler): Linear 2*out*in, Conv 2*out*(cin/g)*kh*kw,
matmul 2*out*K, normalisation ~5 per element, softmax ~5, GELU ~8, other elementwise 1 per
output element; views and index bookkeeping 0. Backward: ops with weights 2x forward (grad input
+ grad weight), others 1x forward. O(1) per op."""

from __future__ import annotations

import math

ELEMENTWISE_COST = {"gelu": 8, "softmax": 5, "log_softmax": 5, "layernorm": 5, "batchnorm2d": 5,
                    "batchnorm1d": 5, "groupnorm": 5, "tanh": 4, "sigmoid": 4, "silu": 5,
                    "dropout": 1, "relu": 1}
NO_FLOPS = {"embedding", "embeddingbag", "cat", "stack", "getitem", "triu_indices"}


def numel(shape: tuple[int, ...]) -> int:
    """Number of elements of a tensor of `shape` (1 for a scalar)."""
    return math.prod(shape) if shape else 1


def forward_flops(kind: str, out_shape: tuple[int, ...], in_shapes: list[tuple[int, ...]],
                  attrs: dict) -> float:
    """FLOPs of one op; `attrs` carries module hyper-parameters (in_features, kernel, groups)."""
    n = numel(out_shape)
    if kind == "linear":
        return 2.0 * n * attrs["in_features"] + (n if attrs.get("bias") else 0)
    if kind in ("conv1d", "conv2d", "conv3d"):
        return 2.0 * n * (attrs["in_channels"] // attrs["groups"]) * numel(attrs["kernel_size"])
    if kind in ("matmul", "bmm", "mm", "baddbmm", "addmm"):
        a = in_shapes[0] if in_shapes else ()
        k = a[-1] if a else 1
        return 2.0 * n * k
    if kind in ("maxpool2d", "avgpool2d", "adaptiveavgpool2d", "mean", "sum"):
        return float(numel(in_shapes[0])) if in_shapes else float(n)
    if kind in NO_FLOPS:
        return 0.0
    return float(ELEMENTWISE_COST.get(kind, 1) * n)


def backward_flops(fwd: float, has_params: bool, needs_input_grad: bool = True) -> float:
    """Backward FLOPs from forward FLOPs: 2x for ops with parameters (input and weight gradients),
    1x otherwise."""
    if has_params:
        return fwd * (2.0 if needs_input_grad else 1.0)
    return fwd
