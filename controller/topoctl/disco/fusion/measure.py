"""Regions of the catalog models measured on this CPU, eager and compiled by inductor: the
cost model's training data (`bench/sync/fusion_costmodel.py` stores it in `data/regions.json`).

`compile_regions` builds a catalog model, captures its op graph (`graph.capture`), records the
inputs one eager forward gives every module with two compute ops or more
(`regions.modules_with_ops`, up to `MAX_OPS` compute ops) and compiles each such module's
forward (torch.compile, inductor, one torch thread) on them, timing the compile (forward and
backward). `time_regions` then times both versions of every region, forward plus backward,
with `graph.steptime.step_clock` (thread CPU time: other processes on the machine do not
inflate it). The two are apart so that the compiling, minutes of CPU, happens outside the
quiet window in which the timings are taken. Runs models: not pure."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from topoctl.catalog.build import build_model, example_inputs
from topoctl.disco.fusion.model import compute_ops
from topoctl.disco.fusion.regions import modules_with_ops, region_ops
from topoctl.graph.capture import capture
from topoctl.graph.steptime import step_clock

# Small configurations of the six catalog models: a region's step is milliseconds, the whole
# dataset compiles in minutes on two cores. (params, batch)
CONFIGS: dict[str, tuple[dict, int]] = {
    "mlp": ({"layers": 3, "hidden": 256, "features": 128}, 32),
    "resnet": ({"depth": 18, "width": 16, "image": 32, "classes": 10}, 8),
    "vgg": ({"depth": 11, "width": 8, "image": 32, "hidden": 128, "classes": 10}, 8),
    "bert": ({"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 500}, 8),
    "candle_uno": ({"gene": 64, "drug": 128, "fingerprint": 64, "tower": 128,
                    "tower_layers": 2, "hidden": 128, "layers": 3}, 32),
    "dlrm": ({"tables": 4, "rows": 1000, "dim": 16, "dense": 13, "bottom": 64, "top": 128,
              "mlp_layers": 3}, 32),
}

# Regions of more compute ops than this are left out: compiling them costs minutes of CPU on
# a shared 2-core machine, and the larger regions are made of the blocks that are measured.
MAX_OPS = 30


@dataclass
class Region:
    """One region ready to time: its ops (plain data), the eager and compiled steps."""

    model: str
    region: str
    ops: list[dict]
    eager: Callable[[], None]
    fused: Callable[[], None]
    compile_s: float  # wall seconds
    compile_cpu_s: float  # CPU seconds, this process and the compilers it ran (gcc)


def _record(model: nn.Module, paths: list[str], inputs: tuple) -> dict[str, tuple]:
    """Per module path, the args one eager forward with gradients passes it (detached, with
    their `requires_grad`)."""
    seen: dict[str, tuple] = {}

    def keep(v: Any) -> Any:
        return v.detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v

    handles = [model.get_submodule(p).register_forward_pre_hook(
        lambda _m, a, p=p: seen.setdefault(p, tuple(keep(x) for x in a))) for p in paths]
    try:
        model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _step(fn: Callable, args: tuple) -> Callable[[], None]:
    """Forward and backward of `fn(*args)` (the float outputs' sum)."""
    def run() -> None:
        out = fn(*args)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        outs = [t for t in outs if isinstance(t, torch.Tensor) and t.requires_grad]
        if outs:
            torch.autograd.backward([t.float().sum() for t in outs])
    return run


def compile_regions(name: str) -> list[Region]:
    """Every region of catalog model `name` (`CONFIGS`) compiled and ready to time."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # dynamo compiles a code object (nn.Sequential.forward) at most 8 times by default, then
    # runs it eager: the dataset's first run lost 5 regions so (marked invalid in it)
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, 64)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 512)
    params, batch = CONFIGS[name]
    model = build_model(name, params)
    inputs = example_inputs(name, params, batch)
    graph = capture(model, inputs, name)
    ops = {p: compute_ops(region_ops(graph, p)) for p in modules_with_ops(graph)}
    paths = [p for p, n in ops.items() if n <= MAX_OPS]
    recorded = _record(model, paths, inputs)
    out = []
    for p in paths:
        if p not in recorded:  # a container never called (ModuleList): no region of its own
            continue
        mod = model.get_submodule(p)
        fused = _step(torch.compile(mod.forward, backend="inductor", dynamic=False),
                      recorded[p])
        t0, c0 = time.perf_counter(), _cpu_seconds()
        fused()
        out.append(Region(name, p, region_ops(graph, p), _step(mod.forward, recorded[p]),
                          fused, time.perf_counter() - t0, _cpu_seconds() - c0))
    return out


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (inductor's gcc runs): a
    compile's cost that a busy machine does not inflate, unlike its wall time."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def median_time(step: Callable[[], None], repeats: int, warmup: int = 2) -> float:
    """Median seconds of `step()` over `repeats` runs after `warmup` (`step_clock`)."""
    clock = step_clock()
    for _ in range(warmup):
        step()
    ts = []
    for _ in range(repeats):
        t0 = clock()
        step()
        ts.append(clock() - t0)
    return statistics.median(ts)


def time_regions(regions: list[Region], repeats: int = 7, rounds: int = 3) -> list[dict]:
    """Every region's sample: its ops, eager and fused seconds (forward + backward; the median
    of `rounds` medians of `repeats`, rounds interleaved over regions) and compile seconds
    (wall and CPU)."""
    eager: dict[int, list[float]] = {}
    fused: dict[int, list[float]] = {}
    for _ in range(rounds):
        for i, r in enumerate(regions):
            eager.setdefault(i, []).append(median_time(r.eager, repeats))
            fused.setdefault(i, []).append(median_time(r.fused, repeats))
    return [{"model": r.model, "region": r.region, "ops": r.ops,
             "eager_s": statistics.median(eager[i]), "fused_s": statistics.median(fused[i]),
             "compile_s": round(r.compile_s, 3), "compile_cpu_s": round(r.compile_cpu_s, 3)}
            for i, r in enumerate(regions)]
