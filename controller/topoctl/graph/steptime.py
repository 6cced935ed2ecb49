"""A whole training step timed on this CPU, as a lab rank's runtime runs it.

`step_clock`: the clock every timing here uses (CPU time of the thread with one torch thread,
wall time with more). `timed_steps`: per-part medians of repeated steps, run until enough
time is timed. `whole_step_times`: the bare model's step, `model(x)` as data-parallel ranks
call it; `stage_step_times`: the model as a one-stage pipeline, fx nodes interpreted one by
one in micro-batches (`topotrain.pipeline.gpipe_passes`). Both give (forward, backward, SGD
step) seconds, to which `graph.cost.fit_to_whole_step` fits the per-op times; `graph.ddpstep`
runs `whole_step_times` on a DDP-wrapped model in a child process. Runs the model: not pure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import fx, nn

from topotrain.timing import Stage, batch_inputs, gpipe_passes

__all__ = ["MAX_STEP_REPEATS", "MIN_TIMED_S", "stage_step_times", "step_clock", "timed_steps",
           "whole_step_times"]

# A whole step is timed `repeats` times at least and until this many seconds of timed steps
# (at most MAX_STEP_REPEATS): a shared VM's speed wanders by +-10% from one 150 ms stretch to the
# next (the AMD EPYC VM: one matmul 2.4-4.0 ms, median 3.0, over a minute), so
# five steps of an MLP (0.9 s) gave 0.149 to 0.185 s per step in three plans minutes apart,
# against 0.164-0.170 s measured in the lab over 3 s.
MIN_TIMED_S = 2.0
MAX_STEP_REPEATS = 60


def step_clock() -> Callable[[], float]:
    """CPU time of this thread when torch computes on it alone (one thread: what a busy
    machine's other processes do not inflate), else wall time."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def timed_steps(step: Callable[[], tuple[float, ...]], warmup: int, repeats: int
                ) -> tuple[float, ...]:
    """Per part, the median seconds of `step()` (which returns the seconds of each of its parts)
    over at least `repeats` runs after `warmup`, run until :data:`MIN_TIMED_S` of timed steps
    (at most :data:`MAX_STEP_REPEATS`)."""
    for _ in range(warmup):
        step()
    times: list[tuple[float, ...]] = []
    total = 0.0
    while len(times) < repeats or (total < MIN_TIMED_S and len(times) < MAX_STEP_REPEATS):
        times.append(step())
        total += sum(times[-1])
    return tuple(statistics.median(t[k] for t in times) for k in range(len(times[0])))


def whole_step_times(model: nn.Module, inputs: tuple[torch.Tensor, ...], warmup: int = 2,
                     repeats: int = 5) -> tuple[float, float, float]:
    """(forward, backward, SGD step) seconds of one whole training step of `model` on this CPU
    at the batch of `inputs` (loss mean(out^2), as the runtimes compute it), medians over
    :func:`timed_steps` (at least `repeats` after `warmup`), timed as
    `graph.cost.measure_train_costs` times ops. The parameters are restored afterwards."""
    params = list(model.parameters())
    saved = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=1e-3)
    clock = step_clock()

    def step() -> tuple[float, float, float]:
        model.zero_grad(set_to_none=True)
        t0 = clock()
        out = model(*inputs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        loss = out.float().pow(2).mean()
        t1 = clock()
        loss.backward()
        t2 = clock()
        opt.step()
        return t1 - t0, t2 - t1, clock() - t2

    times = timed_steps(step, warmup, repeats)
    _restore(params, saved)
    return times


def batch_inputs_seconds(specs: list[dict], batch: int, warmup: int = 2,
                         repeats: int = 7) -> float:
    """Median thread-CPU seconds of drawing one global batch of `batch` samples of the job's
    inputs (`specs`: the plan's ``model.inputs``) as every pipeline rank draws it at the start
    of each iteration (`topotrain.pipeline.batch_inputs`); one torch thread as the ranks run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def draw(i: int) -> float:
            t0 = time.thread_time()
            batch_inputs(specs, batch, i)
            return time.thread_time() - t0

        for i in range(warmup):
            draw(i)
        return statistics.median(draw(warmup + i) for i in range(repeats))
    finally:
        torch.set_num_threads(threads)


def stage_step_times(model: nn.Module, inputs: tuple[torch.Tensor, ...], microbatches: int = 4,
                     warmup: int = 2, repeats: int = 5) -> tuple[float, float, float]:
    """(forward, backward, SGD step) seconds per micro-batch (step: per iteration) of `model` run
    as the pipeline runtime runs a stage (`topotrain.pipeline.gpipe_passes` on a one-stage
    pipeline: fx nodes interpreted one by one, `microbatches` micro-batches of `inputs`,
    gradients accumulated), medians over :func:`timed_steps` (at least `repeats` after
    `warmup`), timed as `graph.cost.measure_train_costs` times ops. The parameters are restored
    afterwards."""
    gm = fx.symbolic_trace(model)
    stage = Stage(gm, [[n.name for n in gm.graph.nodes]], 0, {})
    params = list(gm.parameters())
    saved = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=1e-3)
    micro = [list(inputs)] * microbatches
    clock = step_clock()

    def step() -> tuple[float, float, float]:
        gm.zero_grad(set_to_none=True)
        _, fwd, bwd = gpipe_passes(stage, micro, None, None, microbatches, clock=clock)
        t0 = clock()
        opt.step()
        # whole passes, so that `timed_steps` counts the seconds really timed towards
        # MIN_TIMED_S (per micro-batch figures made it run MAX_STEP_REPEATS steps every time)
        return fwd, bwd, clock() - t0

    fwd, bwd, opt_s = timed_steps(step, warmup, repeats)
    _restore(params, saved)
    return fwd / microbatches, bwd / microbatches, opt_s


def _restore(params: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    """Put the parameters a timing stepped back to `saved`, with no gradients."""
    with torch.no_grad():
        for p, v in zip(params, saved, strict=True):
            p.copy_(v)
            p.grad = None
