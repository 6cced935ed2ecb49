"""Operator fusion in the runtime: the plan's regions (`topocontract.fusion`) compiled as one
each by torch.compile (inductor: fused C++ kernels on this CPU, forward and backward), the
operator-fusion half of DisCo (TPDS-Submission/Disco, yxd886/fuse) done for real.

`apply_fusion` compiles each region in place (its module's ``forward`` replaced by the compiled
one: parameter names, hooks and DDP's view of the model stay as they were) and compiles it
right away, on the inputs one eager forward gave that region, so the compile time is measured
and reported before training starts, not hidden in the first iteration. The budget: a region
whose turn comes after ``budget_s`` seconds of compiling stays eager; a region whose compile
raises goes back to eager. Both are fallbacks made visible: in the `fusion` event (per region:
status, seconds, reason) and as a line on stderr. Compiled code is cached in
`topocontract.fusion.inductor_cache_dir` (inductor's FX-graph and kernel caches), so a second
run of the same plan compiles in a fraction of the time (docs/fusion.md, docs/results.md).
Cost: one eager forward plus one forward and backward per region."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from topocontract.cachedir import open_private, private_dir
from topocontract.fusion import CACHE_ENV, FusionPlan, inductor_cache_dir
from topotrain.events import emit


@dataclass
class RegionResult:
    """One region's outcome: ``compiled``, ``failed`` (compile raised: eager) or ``budget``
    (not compiled: the budget was spent), with the compile seconds and why."""

    region: str
    status: str
    seconds: float = 0.0
    reason: str = ""


@dataclass
class FusionReport:
    """What `apply_fusion` did: per region its result, and the cache directory used."""

    mode: str
    cache_dir: str
    regions: list[RegionResult] = field(default_factory=list)

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling (all regions, failed ones too)."""
        return sum(r.seconds for r in self.regions)

    @property
    def fallbacks(self) -> list[RegionResult]:
        """The regions that run eager although the plan asked for them to be compiled."""
        return [r for r in self.regions if r.status != "compiled"]

    def event(self, rank: int) -> dict[str, Any]:
        """The `fusion` event of this report."""
        return {"event": "fusion", "rank": rank, "mode": self.mode, "cache_dir": self.cache_dir,
                "compile_seconds": round(self.compile_seconds, 3),
                "regions": [[r.region, r.status, round(r.seconds, 3), r.reason]
                            for r in self.regions],
                "fallback": bool(self.fallbacks)}


def apply_fusion(model: nn.Module, plan: FusionPlan, inputs: list[torch.Tensor], rank: int,
                 backend: str | Callable = "inductor") -> FusionReport:
    """Compile `plan`'s regions of `model` in place and warm each up on the inputs an eager
    forward of `inputs` gives it; one `fusion` event (and a stderr line per fallback). The
    model's buffers (BatchNorm statistics) and gradients are as before the warm-up. `backend`:
    torch.compile's (tests pass one that raises). Nothing is done for mode ``none``."""
    if plan.mode == "none" or not plan.regions:
        return FusionReport(plan.mode, inductor_cache_dir())
    # only a directory this user alone can write: inductor unpickles what it finds there
    cache, warning = private_dir(inductor_cache_dir(), f"topoctl-inductor-{os.geteuid()}-")
    if warning:
        print(f"topotrain.fusion: rank {rank}: inductor cache {warning}", file=sys.stderr,
              flush=True)
    # set, not defaulted: inductor writes its own default into the variable once it has run
    os.environ[CACHE_ENV] = cache
    report = FusionReport(plan.mode, cache)
    raise_recompile_limit(8 + len(plan.regions))
    buffers = {k: v.detach().clone() for k, v in model.state_dict().items()}
    region_inputs = _record_inputs(model, plan.regions, inputs)
    with _one_compiler_per_cache(report.cache_dir):
        _compile_regions(model, plan, region_inputs, backend, report)
    model.load_state_dict(buffers)
    model.zero_grad(set_to_none=True)
    for r in report.fallbacks:
        print(f"topotrain.fusion: rank {rank}: region {r.region or '<whole model>'} runs eager "
              f"({r.status}: {r.reason})", file=sys.stderr, flush=True)
    emit(**report.event(rank))
    return report


@contextlib.contextmanager
def _one_compiler_per_cache(cache_dir: str) -> Iterator[None]:
    """Hold the cache directory's compile lock: ranks that share an inductor cache (the ranks
    of one host) compile one after the other, so every rank after the first loads the first
    one's kernels from the cache (a fraction of a cold compile's CPU) instead of compiling the
    same graph at the same time. Ranks with caches of their own never wait for each other."""
    fd = open_private(cache_dir, "topotrain-compile.lock")  # never through a symlink
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the file closes, also on a crash
        yield
    finally:
        os.close(fd)


def _compile_regions(model: nn.Module, plan: FusionPlan,
                     region_inputs: dict[str, tuple[tuple, dict]],
                     backend: str | Callable, report: FusionReport) -> None:
    """Each region compiled in turn until the plan's budget of compile seconds is spent."""
    spent = 0.0
    for path in plan.regions:
        if spent >= plan.budget_s:
            reason = f"budget of {plan.budget_s:g} s spent ({spent:.1f} s)"
            report.regions.append(RegionResult(path, "budget", 0.0, reason))
            continue
        res = _compile_region(model.get_submodule(path), path, region_inputs.get(path), backend)
        spent += res.seconds
        report.regions.append(res)


def raise_recompile_limit(limit: int) -> None:
    """Let dynamo compile one code object `limit` times: regions of one class with other
    shapes (a model's nn.Sequential stem, towers and heads; ResNet blocks of each stage) each
    compile ``forward`` anew, and past dynamo's default of 8 it silently runs the rest eager
    (measured: CANDLE-Uno's towers, docs/fusion.md)."""
    cfg = torch._dynamo.config  # public settings module of dynamo
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), limit))
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 8 * limit)


def _record_inputs(model: nn.Module, regions: tuple[str, ...], inputs: list[torch.Tensor]
                   ) -> dict[str, tuple[tuple, dict]]:
    """Per region, the (args, kwargs) one eager forward of `inputs` passes it: tensors detached
    and needing a gradient as they did (a region's compiled backward depends on it)."""
    seen: dict[str, tuple[tuple, dict]] = {}

    def keep(v: Any) -> Any:
        return v.detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v

    def hook(path: str):
        def pre(_mod, args, kwargs):
            seen.setdefault(path, (tuple(keep(a) for a in args),
                                   {k: keep(v) for k, v in kwargs.items()}))
        return pre

    handles = [model.get_submodule(p).register_forward_pre_hook(hook(p), with_kwargs=True)
               for p in regions]
    try:
        with torch.enable_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _compile_region(mod: nn.Module, path: str, recorded: tuple[tuple, dict] | None,
                    backend: str | Callable) -> RegionResult:
    """`mod`'s forward replaced by its compiled version and compiled now (a forward and a
    backward on `recorded`), timed; back to eager when that raises."""
    if recorded is None:
        return RegionResult(path, "failed", 0.0, "the region did not run in a forward pass")
    eager = mod.forward
    mod.forward = torch.compile(eager, backend=backend, dynamic=False)
    t0 = time.perf_counter()
    try:
        args, kwargs = recorded
        out = mod(*args, **kwargs)
        outs = [t for t in _tensors(out) if t.requires_grad]
        if outs:
            torch.autograd.backward([t.float().sum() for t in outs])
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run it eager
        del mod.forward  # the class's own forward again
        # dynamo's wrapper line, then the compiler's own first line
        lines = [x.strip() for x in str(e).splitlines() if x.strip()][:2]
        return RegionResult(path, "failed", time.perf_counter() - t0,
                            f"{type(e).__name__}: {' '.join(lines)}"[:300])
    return RegionResult(path, "compiled", time.perf_counter() - t0)


def _tensors(v: Any) -> list[torch.Tensor]:
    """The tensors in `v` (a tensor, or nested tuples and lists), in order."""
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for x in v for t in _tensors(x)]
    return []
