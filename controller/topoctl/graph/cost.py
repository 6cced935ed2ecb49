"""Per-op cost: a device-type roofline (Williams et al., CACM'09) or timings measured on this CPU.

`roofline_costs`: t = launch + max(FLOPs / (eff * peak), bytes / (eff * mem_bw)) per op, forward
and backward (backward bytes ~ 2x forward: read activations and gradients, write both); views
cost 0; embedding lookups move the rows they gather, not their table. O(ops).
`measure_costs`: a timed fx Interpreter on real tensors (warm-up runs, then the median of
`repeats` runs per node); backward estimated as the forward time scaled by the op's FLOP ratio
(2x for ops with weights, 1x otherwise), as TAG and FlexFlow do when only forward is profiled.
Measuring is I/O-free but not pure (it runs the model); its results are cached by
`graph.cache`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx, nn

from topoctl.graph.devices import Device
from topoctl.graph.ops import OpGraph


@dataclass(frozen=True)
class OpCost:
    """Seconds one op takes forward and backward."""

    fwd: float  # seconds
    bwd: float


LOOKUP_KINDS = frozenset({"embedding", "embeddingbag"})  # gather rows of a parameter table


def roofline_costs(graph: OpGraph, device: Device, dtype: str = "float32") -> dict[str, OpCost]:
    """Per-op forward/backward seconds on `device` by the roofline model (views cost nothing;
    an embedding lookup moves the rows it gathers and their gradients, as DLRM-style sparse
    updates do, not its whole table)."""
    peak = device.peak(dtype) * device.efficiency
    bw = device.mem_bw * device.efficiency
    out = {}
    for op in graph.ops:
        if op.is_view:
            out[op.name] = OpCost(0.0, 0.0)
            continue
        # a lookup reads the rows it gathers (as many bytes as it outputs), not its table: the
        # table's bytes would make it a fixed cost that the hybrid strategies then scale by the
        # batch an owner serves (a 512 MB DLRM table cost its owner 0.14 s per iteration)
        params = 2 * op.out_bytes if op.kind in LOOKUP_KINDS else op.param_bytes
        moved = op.in_bytes + op.out_bytes + params
        fwd = device.launch + max(op.flops / peak, moved / bw)
        bwd = device.launch + max(op.bwd_flops / peak, 2 * moved / bw)
        out[op.name] = OpCost(fwd, bwd)
    return out


class _TimedInterpreter(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.times: dict[str, list[float]] = {}

    def run_node(self, n: fx.Node):
        t0 = time.perf_counter()
        r = super().run_node(n)
        self.times.setdefault(n.name, []).append(time.perf_counter() - t0)
        return r


def measure_costs(model: nn.Module, inputs: tuple[torch.Tensor, ...], graph: OpGraph,
                  warmup: int = 1, repeats: int = 3) -> dict[str, OpCost]:
    """Time each fx node on this CPU (median of `repeats` after `warmup` runs).

    `graph` must come from capturing the same model (node names match)."""
    gm = fx.symbolic_trace(model)
    interp = _TimedInterpreter(gm)
    with torch.no_grad():
        for _ in range(warmup):
            interp.run(*inputs)
        interp.times.clear()
        for _ in range(repeats):
            interp.run(*inputs)
    out = {}
    for op in graph.ops:
        if op.is_view:
            out[op.name] = OpCost(0.0, 0.0)
            continue
        fwd = statistics.median(interp.times.get(op.name, [0.0]))
        ratio = op.bwd_flops / op.flops if op.flops else 1.0
        out[op.name] = OpCost(fwd, fwd * ratio)
    return out


def scale_costs(costs: dict[str, OpCost], factor: float) -> dict[str, OpCost]:
    """Costs for `factor` times the profiled batch (compute-bound ops scale linearly)."""
    return {k: OpCost(c.fwd * factor, c.bwd * factor) for k, c in costs.items()}


def totals(costs: dict[str, OpCost]) -> tuple[float, float]:
    """(total forward seconds, total backward seconds) of `costs`."""
    return sum(c.fwd for c in costs.values()), sum(c.bwd for c in costs.values())


@dataclass(frozen=True)
class TrainCost:
    """Seconds one op takes in a training step on this CPU, measured at one batch size.

    `bwd_params`: its backward when none of its inputs needs a gradient (only its own
    parameters' gradients; 0 for ops without parameters: autograd skips them); `bwd_inputs`:
    its backward when its floating-point inputs need gradients too (every op after the first
    parameter, and everything a later pipeline stage received); `step`: the SGD step over its
    parameters."""

    fwd: float
    bwd_params: float
    bwd_inputs: float
    step: float = 0.0


def _clock():
    """CPU time of this thread when torch computes on it alone (one thread: what a busy
    machine's other processes do not inflate), else wall time."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def _median_time(fn, warmup: int, repeats: int) -> float:
    clock = _clock()
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    return statistics.median(ts)


def _tensors(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for x in v for t in _tensors(x)]
    return []


def measure_train_costs(model: nn.Module, inputs: tuple[torch.Tensor, ...], graph: OpGraph,
                        warmup: int = 2, repeats: int = 5,
                        runtime: str = "module", corun: int = 0,
                        ddp_bucket_bytes: int | None = None) -> dict[str, TrainCost]:
    """Time every fx node of `model` forward, backward (both variants of `TrainCost`) and its
    SGD step on this CPU at the batch of `inputs`, each op on its real input values, with
    gradients enabled as in training (median of `repeats` after `warmup` runs; CPU time of the
    thread with one torch thread, so that other processes on a busy machine do not inflate
    it; wall time with more). The output node
    is charged the pipeline runtime's loss, mean(out^2), and its backward. Views cost 0.

    Per op rather than per stage so that any split of the model can be costed; what the sum
    leaves out (the runtime's per-node interpretation, a few microseconds) is small against
    the compute of a layer. The per-op times are then fitted to a whole step timed the same
    way (`fit_to_whole_step`), as the runtime that will run it calls the model: `runtime`
    "module" (data-parallel ranks: `model(x)`, `whole_step_times`) or "stage" (pipeline ranks:
    fx nodes interpreted one by one in micro-batches, `stage_step_times`; 8-10% slower on the
    demo's MLP; with `ddp_bucket_bytes`, "module" is timed through DDP with buckets of that
    size, as the lab's trainer runs it: `graph.ddpstep`). `corun`: that many copies of the
    training step run beside the whole step's timing (`graph.corun`: lab ranks share this
    machine's cores, and a step takes 10-15% more CPU beside 4-7 others than alone), so the fit
    carries what sharing costs. `graph` must come
    from capturing the same model (names match). Runs the model (and with `corun` child
    processes): not pure; cached by `graph.cache`."""
    gm = fx.symbolic_trace(model)
    interp = fx.Interpreter(gm, garbage_collect_values=False)
    with torch.no_grad():
        interp.run(*inputs)
    env = dict(interp.env)
    modules = dict(gm.named_modules())
    ops = graph.by_name()
    out: dict[str, TrainCost] = {}
    for n in gm.graph.nodes:
        op = ops.get(n.name)
        if n.op == "placeholder" or op is None or (op.is_view and n.op != "output"):
            out[n.name] = TrainCost(0.0, 0.0, 0.0)
            continue
        params = (list(modules[n.target].parameters()) if n.op == "call_module"
                  else [])

        def run(grad_inputs: bool, n=n):
            for a in n.all_input_nodes:
                v = env[a]
                if isinstance(v, torch.Tensor):
                    v = v.detach()
                    if grad_inputs and v.is_floating_point():
                        v.requires_grad_(True)
                interp.env[a] = v
            with torch.enable_grad():
                if n.op == "output":
                    r = interp.run_node(n)
                    r = r[0] if isinstance(r, (tuple, list)) else r
                    return [r.float().pow(2).mean()]
                return _tensors(interp.run_node(n))

        fwd = _median_time(lambda: run(True), warmup, repeats)

        def bwd_time(grad_inputs: bool, params=params, run=run) -> float:
            for p in params:
                p.grad = None

            def once() -> float:  # after the first: accumulating into .grad, as micro-batches do
                outs = [t for t in run(grad_inputs) if t.requires_grad]
                if not outs:
                    return 0.0
                grads = [torch.randn_like(t) for t in outs]
                clock = _clock()
                t0 = clock()
                torch.autograd.backward(outs, grads)
                return clock() - t0
            for _ in range(warmup):
                once()
            return statistics.median(once() for _ in range(repeats))

        try:
            bwd_p, bwd_i = bwd_time(False), bwd_time(True)
        except RuntimeError:  # e.g. an in-place op on an input leaf: the FLOP ratio instead
            ratio = op.bwd_flops / op.flops if op.flops else 1.0
            bwd_p = bwd_i = fwd * ratio
        step = 0.0
        if params:
            for p in params:
                p.grad = torch.zeros_like(p)
            opt = torch.optim.SGD(params, lr=1e-3)
            with torch.no_grad():
                saved = [p.detach().clone() for p in params]
                step = _median_time(opt.step, warmup, repeats)
                for p, s in zip(params, saved, strict=True):
                    p.copy_(s)
                    p.grad = None
        out[n.name] = TrainCost(fwd, bwd_p, bwd_i, step)
    costs = {o.name: out.get(o.name, TrainCost(0.0, 0.0, 0.0)) for o in graph.ops}
    if runtime not in ("module", "stage"):
        raise ValueError(f"runtime {runtime!r}: module or stage")
    from topoctl.graph.corun import co_running

    with co_running(model, inputs, corun):
        if runtime == "stage":
            whole = stage_step_times(model, inputs, warmup=warmup, repeats=repeats)
        elif ddp_bucket_bytes:
            from topoctl.graph.ddpstep import ddp_step_times

            whole = ddp_step_times(model, inputs, ddp_bucket_bytes, torch.get_num_threads(),
                                   warmup, repeats)
        else:
            whole = whole_step_times(model, inputs, warmup, repeats)
    return fit_to_whole_step(costs, graph, whole)


# A whole step is timed `repeats` times at least and until this many seconds of timed steps
# (at most MAX_STEP_REPEATS): a shared VM's speed wanders by +-10% from one 150 ms stretch to the
# next (the AMD EPYC VM, 2026-11-26: one matmul 2.4-4.0 ms, median 3.0, over a minute), so
# five steps of an MLP (0.9 s) gave 0.149 to 0.185 s per step in three plans minutes apart,
# against 0.164-0.170 s measured in the lab over 3 s.
MIN_TIMED_S = 2.0
MAX_STEP_REPEATS = 60


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
    :func:`timed_steps` (at least `repeats` after `warmup`), timed as `measure_train_costs`
    times ops. The parameters are restored afterwards."""
    params = list(model.parameters())
    saved = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=1e-3)
    clock = _clock()

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
    with torch.no_grad():
        for p, v in zip(params, saved, strict=True):
            p.copy_(v)
            p.grad = None
    return times


def stage_step_times(model: nn.Module, inputs: tuple[torch.Tensor, ...], microbatches: int = 4,
                     warmup: int = 2, repeats: int = 5) -> tuple[float, float, float]:
    """(forward, backward, SGD step) seconds per micro-batch (step: per iteration) of `model` run
    as the pipeline runtime runs a stage (`topotrain.pipeline.gpipe_passes` on a one-stage
    pipeline: fx nodes interpreted one by one, `microbatches` micro-batches of `inputs`,
    gradients accumulated), medians over :func:`timed_steps` (at least `repeats` after
    `warmup`), timed as `measure_train_costs` times ops. The parameters are restored afterwards."""
    from topotrain.timing import Stage, gpipe_passes

    gm = fx.symbolic_trace(model)
    stage = Stage(gm, [[n.name for n in gm.graph.nodes]], 0, {})
    params = list(gm.parameters())
    saved = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=1e-3)
    micro = [list(inputs)] * microbatches
    clock = _clock()

    def step() -> tuple[float, float, float]:
        gm.zero_grad(set_to_none=True)
        _, fwd, bwd = gpipe_passes(stage, micro, None, None, microbatches, clock=clock)
        t0 = clock()
        opt.step()
        return fwd / microbatches, bwd / microbatches, clock() - t0

    times = timed_steps(step, warmup, repeats)
    with torch.no_grad():
        for p, v in zip(params, saved, strict=True):
            p.copy_(v)
            p.grad = None
    return times


def whole_step_backward(graph: OpGraph, costs: dict[str, TrainCost]) -> dict[str, float]:
    """Per op, the backward a whole-model training step runs: its `bwd_inputs` once a value
    before it needs a gradient (after the first op with parameters), else `bwd_params` (the
    input batch needs none; the staged rule is `placement.runtime.needs_grad`). O(ops)."""
    needs: dict[str, bool] = {}
    out: dict[str, float] = {}
    for o in graph.ops:
        c = costs[o.name]
        grad_in = any(needs.get(i, False) for i in o.inputs)
        needs[o.name] = o.kind != "placeholder" and (o.param_bytes > 0 or grad_in)
        out[o.name] = c.bwd_inputs if grad_in else c.bwd_params
    return out


def fit_to_whole_step(costs: dict[str, TrainCost], graph: OpGraph,
                      whole: tuple[float, float, float]) -> dict[str, TrainCost]:
    """`costs` scaled so that a whole-model step adds up to `whole` (forward, backward, step):
    each op timed alone runs with its operands hot in cache and without the step's framework
    work between ops (autograd's graph, allocation), so the sum of the per-op times falls short
    of a real step (MLP of the demo, batch 96 on this CPU: forward 12%, backward 12% and step
    47% short, which made the one-host pipeline's prediction -11% to -20% in the lab). One
    factor per phase, the same for every op: a split of the model is still costed by its ops.
    The whole step's backward is the one autograd runs (`whole_step_backward`). O(ops)."""
    fwd = sum(c.fwd for c in costs.values())
    bwd = sum(whole_step_backward(graph, costs).values())
    step = sum(c.step for c in costs.values())
    kf, kb, ks = (w / s if s > 0 and w > 0 else 1.0
                  for w, s in zip(whole, (fwd, bwd, step), strict=True))
    return {k: TrainCost(kf * c.fwd, kb * c.bwd_params, kb * c.bwd_inputs, ks * c.step)
            for k, c in costs.items()}
