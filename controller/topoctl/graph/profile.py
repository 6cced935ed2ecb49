"""Glue from a job to an op graph and per-op costs (the one module here that may touch the
profile cache on disk and run the model; everything it calls is pure).

`device_table(cluster)` merges the cluster's `gpu_types` over the built-in `DEVICES`;
`job_costs` picks roofline or measurement per the job's `cost.method` (auto: measure when the
host type is `cpu`, roofline otherwise)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import torch

from topoctl.catalog.build import build_model, example_inputs
from topoctl.catalog.registry import InputSpec as CatalogInput
from topoctl.graph import cache, sandbox
from topoctl.graph.capture import DTYPES, capture_catalog
from topoctl.graph.cost import (
    OpCost,
    TrainCost,
    measure_costs,
    measure_train_costs,
    roofline_costs,
    scale_costs,
)
from topoctl.graph.devices import DEVICES, Device
from topoctl.graph.forks import FORKS
from topoctl.graph.ops import OpGraph
from topoctl.graph.steptime import batch_inputs_seconds
from topotrain.timing import ensure_calibration

PROFILE_BATCH = 4  # default batch timed on this CPU; costs scale linearly to the rank's batch
# where the long steps here (timing on this CPU: seconds to a minute each) report that they
# start, while `reporting` is active (`topoctl plan` prints them on stderr)
_PROGRESS: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "topoctl_profile_progress", default=None)


@contextlib.contextmanager
def reporting(progress: Callable[[str], None] | None) -> Iterator[None]:
    """While inside, each timing this module starts is announced to `progress` (None:
    silent), with what it times: `plan --retime` timed for a minute in silence."""
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def say(msg: str) -> None:
    """Announce a step to the active `reporting` callback, if any."""
    fn = _PROGRESS.get()
    if fn is not None:
        fn(msg)


def _inputs(job) -> list[CatalogInput]:
    return [CatalogInput(tuple(i.shape), i.dtype, i.high) for i in job.model.inputs]


def job_graph(job, batch: int) -> OpGraph:
    """Capture the job's model for `batch` samples on the meta device (no memory used)."""
    m = job.model
    if m.catalog:
        return capture_catalog(m.catalog, m.params, batch, job.dtype)
    return sandbox.factory_graph(job, batch)  # the job's code: a child, unprivileged


def device_table(cluster) -> dict[str, Device]:
    """The built-in device types with the cluster's `gpu_types` merged over them."""
    out = dict(DEVICES)
    for name, t in cluster.gpu_types.items():
        flops = dict.fromkeys(("float32", "float16", "bfloat16"), t.peak_flops)
        out[name] = Device(name, flops, t.memory_bandwidth,
                           **({"memory": t.memory} if t.memory else {}))
    return out


def measure_job(job, graph: OpGraph, profile_batch: int, use_cache: bool = True
                ) -> dict[str, OpCost]:
    """Time the job's model on this CPU at `profile_batch` (float32: CPUs lack fast fp16) with
    the job's `launch.threads` torch threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(job.launch.threads)  # time as the ranks will run
    try:
        return _measure(job, graph, profile_batch, use_cache)
    finally:
        torch.set_num_threads(threads)


def _measure(job, graph: OpGraph, profile_batch: int, use_cache: bool) -> dict[str, OpCost]:
    m = job.model
    key = cache.profile_key(m.catalog or m.factory, m.params or m.kwargs, profile_batch,
                            "float32")
    if use_cache:
        hit = cache.load(key)
        if hit is not None and set(hit) == {o.name for o in graph.ops}:
            return hit
    torch.manual_seed(0)
    say(f"timing each op of {m.catalog or m.factory} on this CPU at batch {profile_batch}")
    if m.catalog:
        model = build_model(m.catalog, m.params)
        inputs = example_inputs(m.catalog, m.params, profile_batch)
        small = capture_catalog(m.catalog, m.params, profile_batch)
        costs = measure_costs(model, inputs, small)
    else:  # the job's code: timed in a child process as an unprivileged user
        costs = sandbox.factory_costs(job, profile_batch)
    if use_cache:
        cache.store(key, costs)
    return costs


_RETIMED: set[str] = set()  # cache keys re-timed by this process (`retime`)
_RUNTIME = "runtime-calibration"  # `_RETIMED`'s entry for `retime_runtime_calibration`


def retime_runtime_calibration() -> None:
    """Measure the tree runtime's CPU costs on this machine again (``python -m
    topotrain.collectives.calibrate --force``: a few seconds) and cache them, once per process
    (again after `forget_retimed`), as `retime` does for the ops: this VM's per-message cost
    moved from 34 to 44 us within a day, with the op times within 2%."""
    if _RUNTIME in _RETIMED:
        return
    say("measuring the tree runtime's CPU costs on this machine (--retime)")
    ensure_calibration(force=True, context=FORKS)  # its processes fork with torch imported
    _RETIMED.add(_RUNTIME)



def retimed() -> list[str]:
    """What this process has timed again so far (`retime`: cache keys, and the runtime
    calibration), for a child process that plans on with these timings (`adopt_retimed`)."""
    return sorted(_RETIMED)


def adopt_retimed(done: list[str]) -> None:
    """Count `done` (a parent's `retimed`) as timed again by this process: its `retime` then
    reads those timings from the cache the parent wrote instead of timing them a second time
    (`make demo` plans the pipeline strategies in a child process while it measures the
    others)."""
    _RETIMED.update(done)


def forget_retimed() -> None:
    """Make the next `retime` time the ops again although this process already did: for a
    caller that plans right before each measurement (the demo), on a machine whose speed moves
    within minutes."""
    _RETIMED.clear()


def measure_train_job(job, batch: int, use_cache: bool = True, runtime: str = "module",
                      retime: bool = False, corun: int = 0, fresh: bool = False
                      ) -> dict[str, TrainCost] | None:
    """Per-op training costs of the job's model on this CPU at exactly `batch` samples (the
    pipeline's micro-batch: no linear scaling from a small profile batch, whose per-call
    overhead would dominate), with the job's `launch.threads` torch threads, fitted to a whole
    step as `runtime` runs the model ("module": data-parallel ranks, "stage": pipeline ranks;
    `graph.cost.measure_train_costs`). Cached per model, sizes, batch, runtime, torch, CPU and
    threads (`graph.cache`); `retime`: time again once per process and cache that (this VM's
    speed varied by up to 30% within an hour); `corun`: the whole step timed with
    that many copies running beside it (the lab's other ranks on this machine's cores,
    `graph.corun`), cached apart; "module" steps are timed through DDP with the job's
    ``sync.bucket`` (`graph.ddpstep`: DDP's own copies are the rank's compute). None when the
    model cannot run a training step on real tensors here (the caller keeps its costs).
    `fresh`: time now whatever the cache and this process hold, then cache it as `retime` does
    (a timing that must be made together with another, `measure_stage_crowding`, and that later
    calls at the same batch reuse instead of timing it again)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(job.launch.threads)
    try:
        m = job.model
        # "-fitted": per-op times fitted to a whole step (older cached timings are not;
        # "-node": the forward's excess over the ops shared per node, `fit_to_whole_step`;
        # "-gcfrozen": timed with the collector frozen, as ranks run, `graph.cost.frozen_gc`);
        # "-ddp": data-parallel steps timed through DDP (older ones were the bare model's)
        ddp = int(job.sync.bucket) if runtime == "module" else None
        key = cache.profile_key(m.catalog or m.factory, m.params or m.kwargs, batch,
                                "train-float32-fitted-node-gcfrozen"
                                + ("-stage" if runtime == "stage" else "")
                                + (f"-ddp{ddp}" if ddp else "")
                                + (f"-corun{corun}" if corun > 0 else ""))
        graph = job_graph(job, batch)
        names = {o.name for o in graph.ops}
        if use_cache and not fresh and not (retime and key not in _RETIMED):
            hit = cache.load_train(key)
            if hit is not None and set(hit) == names:
                return hit
        _RETIMED.add(key)
        torch.manual_seed(0)
        say(f"timing a training step of {m.catalog or m.factory} on this CPU at batch {batch} "
            f"({'a pipeline stage' if runtime == 'stage' else 'data-parallel'}"
            + (f", beside {corun} co-running copies" if corun > 0 else "") + ")")
        if not m.catalog:  # the job's code: timed in a child process, unprivileged
            costs = sandbox.factory_train_costs(job, batch, runtime, corun, ddp)
            if costs is None:
                return None
        else:
            model = build_model(m.catalog, m.params)
            inputs = example_inputs(m.catalog, m.params, batch)
            try:
                costs = measure_train_costs(model.to(DTYPES["float32"]), inputs, graph,
                                            runtime=runtime, corun=corun,
                                            ddp_bucket_bytes=ddp)
            except Exception as e:  # noqa: BLE001 - a model that does not train here: no
                # timing, and the reason said (a cost that quietly changes source hides it)
                sandbox.untimed(m.catalog, batch, f"{type(e).__name__}: "
                                                  f"{' '.join(str(e).split())[:300]}")
                return None
        if use_cache:
            cache.store_train(key, costs)
        return costs
    finally:
        torch.set_num_threads(threads)


def measure_batch_inputs(job, batch: int, use_cache: bool = True, retime: bool = False
                         ) -> float:
    """CPU seconds a pipeline rank spends drawing the iteration's global batch of `batch`
    samples (`graph.steptime.batch_inputs_seconds`, on the plan's input specs), cached like
    the op times (`graph.cache`; `retime`: once per process again)."""
    from topoctl.render.plan import model_launch_spec  # the specs the ranks get

    m = job.model
    key = cache.profile_key(m.catalog or m.factory, m.params or m.kwargs, batch,
                            "batch-inputs-float32")
    if use_cache and not (retime and key not in _RETIMED):
        hit = cache.load(key)
        if hit is not None and "batch_inputs" in hit:
            return hit["batch_inputs"].fwd
    _RETIMED.add(key)
    say(f"timing how long drawing a batch of {batch} samples takes")
    seconds = batch_inputs_seconds(model_launch_spec(m)["inputs"], batch)
    if use_cache:
        cache.store(key, {"batch_inputs": OpCost(seconds, 0.0)})
    return seconds


def measure_stage_crowding(job, batch: int, copies: int, use_cache: bool = True) -> float | None:
    """CPU time of a pipeline stage's step (the whole model as one stage at `batch`, as the
    runtime runs it) beside `copies` co-running copies over its CPU time alone, both timed
    now one after the other (`measure_train_job`); cached per model, batch and copies and not
    timed again on `retime` (a ratio of two timings made together: the machine's speed drift
    cancels, and the demo's budget has no room for the copies' seconds on every plan). The
    timing alone is the stage's timing at `batch` too (cached, and counted as re-timed by this
    process): the pipeline strategies time the stage at the same grid batch right after, and
    timed it twice before (a cold `make demo` paid about 3 CPU-s for it on the AMD EPYC VM).
    None when the model does not train here or the ratio is not plausible (`crowding_ratio`),
    and then no ratio is cached."""
    m = job.model
    key = cache.profile_key(m.catalog or m.factory, m.params or m.kwargs, batch,
                            f"stage-crowding-float32-corun{copies}")
    if use_cache:
        hit = cache.load(key)
        if hit is not None and "ratio" in hit:
            return hit["ratio"].fwd
    alone = measure_train_job(job, batch, use_cache=use_cache, runtime="stage", fresh=True)
    crowded = measure_train_job(job, batch, use_cache=False, runtime="stage", corun=copies)
    if alone is None or crowded is None:
        return None
    ratio = crowding_ratio(alone, crowded)
    if ratio is not None and use_cache:
        cache.store(key, {"ratio": OpCost(ratio, 0.0)})
    return ratio


def crowding_ratio(alone: dict[str, TrainCost], crowded: dict[str, TrainCost]) -> float | None:
    """A stage step's CPU time beside co-running copies over alone (`measure_stage_crowding`),
    or None when it is below 1: faster beside copies than alone means the machine was busy
    while the step ran alone (0.80 and 0.92 were timed so), and a cached ratio would outlive
    the load that made it. O(ops)."""
    base = sum(c.fwd + c.bwd_inputs + c.step for c in alone.values())
    busy = sum(c.fwd + c.bwd_inputs + c.step for c in crowded.values())
    return busy / base if base > 0 and busy >= base else None


def job_costs(job, graph: OpGraph, device: Device, measured: bool,
              use_cache: bool = True) -> dict[str, OpCost]:
    """Per-op costs for `graph` (captured at the per-rank batch) on `device`."""
    if not measured:
        return roofline_costs(graph, device, job.dtype)
    pb = job.cost.profile_batch or min(graph.batch, PROFILE_BATCH)
    return scale_costs(measure_job(job, graph, pb, use_cache), graph.batch / pb)
