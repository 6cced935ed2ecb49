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

import bisect
import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from topoctl.graph.corun import co_running
from topoctl.graph.ddpstep import ddp_step_timer
from topoctl.graph.devices import Device
from topoctl.graph.ops import Op, OpGraph
from topoctl.graph.steptime import stage_step_times, step_clock, whole_step_times


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


def timing_grid(batch: int) -> tuple[int, int]:
    """The batch sizes of the timing grid (1, 2, 3, 4, 6, 8, 12, 16, ...: the powers of two
    and three times them) just below and just above `batch`, the same one twice when `batch`
    is on it. A search that tries many micro-batches (TAG's, each 2-3 s of timing on this CPU)
    times at most two grid points per octave and interpolates between them
    (`interpolate_train_costs`). O(log batch)."""
    if batch < 1:
        raise ValueError(f"batch {batch}: at least 1")
    n = batch.bit_length() + 1
    grid = sorted({2 ** i for i in range(n)} | {3 * 2 ** i for i in range(n)})
    k = bisect.bisect_left(grid, batch)
    return (batch, batch) if grid[k] == batch else (grid[k - 1], grid[k])


def interpolate_train_costs(lo: dict[str, TrainCost], hi: dict[str, TrainCost],
                            lo_batch: int, hi_batch: int, batch: int) -> dict[str, TrainCost]:
    """Per op, its `TrainCost` at `batch` linearly between its timings at `lo_batch` and
    `hi_batch` (`timing_grid`'s neighbours: an op's time is affine in the batch between
    them, a fixed per-call part plus a part per sample). Ops timed at only one of the two
    keep that timing. O(ops)."""
    w = (batch - lo_batch) / (hi_batch - lo_batch) if hi_batch != lo_batch else 0.0

    def mix(a: TrainCost, b: TrainCost) -> TrainCost:
        return TrainCost(*(x + w * (y - x) for x, y in zip(
            (a.fwd, a.bwd_params, a.bwd_inputs, a.step),
            (b.fwd, b.bwd_params, b.bwd_inputs, b.step), strict=True)))
    return {k: mix(lo[k], hi[k]) if k in hi else lo[k] for k in lo} | \
        {k: v for k, v in hi.items() if k not in lo}


def _median_time(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` runs after `warmup` (`steptime.step_clock`)."""
    clock = step_clock()
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    return statistics.median(ts)


def _tensors(v: object) -> list[torch.Tensor]:
    """The tensors in `v` (a tensor, or nested tuples and lists), in order."""
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
    processes): not pure; cached by `graph.cache`.

    Steps: `op_train_costs` (every op alone), `_runtime_step_times` (the whole step, beside
    the co-running copies), `fit_to_whole_step`."""
    if runtime not in ("module", "stage"):
        raise ValueError(f"runtime {runtime!r}: module or stage")
    with frozen_gc():
        costs = op_train_costs(model, inputs, graph, warmup, repeats)
        whole = _runtime_step_times(model, inputs, runtime, corun, ddp_bucket_bytes, warmup,
                                    repeats)
    return fit_to_whole_step(costs, graph, whole)


@contextlib.contextmanager
def frozen_gc() -> Iterator[None]:
    """Every object alive now out of the collector's reach for the block, as a rank runs
    (`topotrain.train` freezes what its imports loaded): the collections a timed step
    triggers then walk only what the step made, not torch's and this program's objects (the
    lab MLP's one-host pipeline step measured 13% faster in the ranks once they froze)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def op_train_costs(model: nn.Module, inputs: tuple[torch.Tensor, ...], graph: OpGraph,
                    warmup: int, repeats: int) -> dict[str, TrainCost]:
    """Per op of `graph`, its `TrainCost` timed alone (`_node_train_cost`) on the values one
    no-grad run of the traced `model` on `inputs` gave every node; placeholders, views (but
    the output node) and nodes `graph` does not have cost 0."""
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
        out[n.name] = _node_train_cost(_node_runner(interp, env, n), op, params, warmup,
                                       repeats)
    return {o.name: out.get(o.name, TrainCost(0.0, 0.0, 0.0)) for o in graph.ops}


def _node_runner(interp: fx.Interpreter, env: dict[fx.Node, Any], n: fx.Node
                 ) -> Callable[[bool], list[torch.Tensor]]:
    """`run(grad_inputs)`: node `n` run alone by `interp`, with gradients enabled, on fresh
    detached copies of its input values from `env` (floating-point ones requiring a gradient
    when `grad_inputs`); the tensors it outputs (the output node: the loss mean(out^2))."""

    def run(grad_inputs: bool) -> list[torch.Tensor]:
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

    return run


def _node_train_cost(run: Callable[[bool], list[torch.Tensor]], op: Op,
                     params: list[nn.Parameter], warmup: int, repeats: int) -> TrainCost:
    """One op's forward (`run(True)`), its backward without and with input gradients (the
    forward scaled by its FLOP ratio when autograd refuses, e.g. an in-place op on an input
    leaf) and the SGD step over its `params`."""
    fwd = _median_time(lambda: run(True), warmup, repeats)
    try:
        bwd_p, bwd_i = (_backward_time(run, params, False, warmup, repeats),
                        _backward_time(run, params, True, warmup, repeats))
    except RuntimeError:  # e.g. an in-place op on an input leaf: the FLOP ratio instead
        ratio = op.bwd_flops / op.flops if op.flops else 1.0
        bwd_p = bwd_i = fwd * ratio
    step = _sgd_step_time(params, warmup, repeats) if params else 0.0
    return TrainCost(fwd, bwd_p, bwd_i, step)


def _backward_time(run: Callable[[bool], list[torch.Tensor]], params: list[nn.Parameter],
                   grad_inputs: bool, warmup: int, repeats: int) -> float:
    """Median seconds of the backward of `run(grad_inputs)`'s outputs that need a gradient
    (random output gradients; 0 when none does), `repeats` after `warmup`; `params`' gradients
    cleared first, then accumulated into, as micro-batches do."""
    for p in params:
        p.grad = None

    def once() -> float:  # after the first: accumulating into .grad, as micro-batches do
        outs = [t for t in run(grad_inputs) if t.requires_grad]
        if not outs:
            return 0.0
        grads = [torch.randn_like(t) for t in outs]
        clock = step_clock()
        t0 = clock()
        torch.autograd.backward(outs, grads)
        return clock() - t0

    for _ in range(warmup):
        once()
    return statistics.median(once() for _ in range(repeats))


def _sgd_step_time(params: list[nn.Parameter], warmup: int, repeats: int) -> float:
    """Median seconds of an SGD step over `params` (zero gradients); their values are restored
    and their gradients cleared afterwards."""
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.SGD(params, lr=1e-3)
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
        step = _median_time(opt.step, warmup, repeats)
        for p, s in zip(params, saved, strict=True):
            p.copy_(s)
            p.grad = None
    return step


def _runtime_step_times(model: nn.Module, inputs: tuple[torch.Tensor, ...], runtime: str,
                        corun: int, ddp_bucket_bytes: int | None, warmup: int, repeats: int
                        ) -> tuple[float, float, float]:
    """(forward, backward, SGD step) seconds of a whole step as `runtime` runs the model
    ("stage": `stage_step_times`; "module": through DDP with `ddp_bucket_bytes`,
    `ddpstep.ddp_step_times`, else `whole_step_times`), with `corun` copies of the step running
    beside it (`corun.co_running`). The DDP step's child is set up before the copies start
    (`ddpstep.ddp_step_timer`): only the timed steps run beside them, and the copies do not
    spin through the set-up (with 7 copies on 2 cores that set-up took ~10 s of wall time,
    and the copies burned it)."""
    if runtime != "stage" and ddp_bucket_bytes:
        with ddp_step_timer(model, inputs, ddp_bucket_bytes, torch.get_num_threads(), warmup,
                            repeats) as time_step, co_running(model, inputs, corun):
            return time_step()
    with co_running(model, inputs, corun):
        if runtime == "stage":
            return stage_step_times(model, inputs, warmup=warmup, repeats=repeats)
        return whole_step_times(model, inputs, warmup, repeats)


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
    """`costs` fitted so that a whole-model step adds up to `whole` (forward, backward, step):
    each op timed alone runs with its operands hot in cache and without the step's framework
    work between ops (autograd's graph, allocation), so the sum of the per-op times differs from
    a real step (MLP of the demo, batch 96 on this CPU: forward 12%, backward 12% and step
    47% short, which made the one-host pipeline's prediction -11% to -20% in the lab).

    Forward: what the whole step takes beyond its ops' sum is the runtime's work per node
    (fx interpretation, autograd's node, the output's allocation), the same for a cheap node as
    for a heavy one: it is shared equally among the nodes the runtime interprets (every op but
    the placeholders: views and the output node too), so that a stage is charged by its number
    of nodes as well as by its ops. Timed on the 2-core Xeon VM for the lab MLP at 64 rows,
    every two-stage split's stages as the runtime runs them (fake neighbours): per stage, the
    forward is ``0.98 x (sum of its ops) + 38 us per node and micro-batch`` (least squares),
    and one factor per phase missed the stages by 15.6% rms (a one-linear stage -46%, stars6's
    seven-node second stage -4 to -18%); equal shares per node, fitted to the whole step alone
    as here, by 8.6%. When the whole forward takes less than the ops' sum there is no such
    work to share: the ops are scaled by one factor.

    Backward and step: one factor per phase, the same for every op (an op's backward timed
    alone pays an autograd call of its own, so the ops' sum is above a real backward there, and
    equal shares per node missed the split stages by 39% rms). The whole step's backward is
    the one autograd runs (`whole_step_backward`). A split of the model is then costed by its
    ops (`placement.runtime.stage_costs`). O(ops)."""
    fwd = sum(c.fwd for c in costs.values())
    bwd = sum(whole_step_backward(graph, costs).values())
    step = sum(c.step for c in costs.values())
    kb, ks = (w / s if s > 0 and w > 0 else 1.0
              for w, s in zip(whole[1:], (bwd, step), strict=True))
    fitted_fwd = _fit_forward(costs, graph, whole[0], fwd)
    return {k: TrainCost(fitted_fwd[k], kb * c.bwd_params, kb * c.bwd_inputs, ks * c.step)
            for k, c in costs.items()}


def _fit_forward(costs: dict[str, TrainCost], graph: OpGraph, whole: float, summed: float
                 ) -> dict[str, float]:
    """Per op, its forward fitted to a `whole` forward whose ops add up to `summed`
    (`fit_to_whole_step`): the excess in equal shares per interpreted node, or, when the whole
    is not above the sum, one factor; nothing timed: as they are. O(ops)."""
    nodes = {o.name for o in graph.ops if o.kind != "placeholder"} & set(costs)
    if summed <= 0 or whole <= 0:
        return {k: c.fwd for k, c in costs.items()}
    if whole <= summed or not nodes:
        return {k: c.fwd * whole / summed for k, c in costs.items()}
    share = (whole - summed) / len(nodes)
    return {k: c.fwd + (share if k in nodes else 0.0) for k, c in costs.items()}
