"""A training program for plans: DDP over gloo with the plan's collective, synthetic data.

Started by `topo-agent launch` with the plan's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TOPOCTL_BIND_ADDRESS) and TOPOCTL_JOB naming the job spec. The model is whatever
`job.model.factory` ("package.module:callable", called with `job.model.kwargs`) builds, fed
synthetic inputs shaped as `job.model.inputs`; the controller fills both in for catalog models,
so this module imports nothing of the controller.

Gloo binds the host's training address (a /32 routed over the fabric), not the first address
of an interface: `topo-agent launch` runs each rank in a UTS namespace whose hostname is that
address, and gloo's default device binds what the hostname resolves to.
With `collective.algorithm: trees` the plan's tree schedule runs as a DDP communication hook;
with `collective.hierarchical` (hosts running several ranks) the hierarchical AllReduce does
(`topotrain.collectives.hierarchy`: reduce-scatter in the host, ring or trees across hosts per
shard, all-gather in the host).
With `batch.shares` each rank draws its own share of the global batch and weights its loss by it
(`topotrain.shares`); the `sfb` layers are synchronised by sufficient-factor broadcasting
(`topotrain.sfb`).

One JSON line per event on the event channel (`topotrain.events`: the pipe the launcher
gives the rank, stdout without one): `start` (rank, world, local rank, the CPU group the
kernel has the rank in, bind address, ...), `resume` (rank 0, when continuing from a
checkpoint: iterations already done, source rank), `iter` (rank, iteration, seconds, loss; tree
plans: `allreduce`, per gradient bucket [bytes, seconds waiting for the tree runtime's thread,
seconds of its AllReduce]; plans naming their buckets, `job.collective.bucket_plan`:
`buckets`, per bucket [index, bytes, ready, start, end] in seconds from its first ready
gradient, in the order started: `topotrain.buckets`; with `bucket_overlap: forward` the
buckets applied in this iteration's forward (the previous iteration's) or flushed after the
last, with where and when they were waited for; the last iteration's `seconds` leave the
flush out, `flush_seconds` says how long it took) and
`done` (checksum of the final parameters, identical on every rank when training was synchronous).

With `checkpoint.every` the run checkpoints (`topotrain.checkpoint`) and with `checkpoint.resume`
it continues from the newest checkpoint: the iteration count goes on, and since each rank's
synthetic batch is a function of (seed, rank, iteration), a resumed run computes what the
uninterrupted one would have.

Test-only switch (never set in production): TOPO_TRAIN_EXIT_AFTER=k makes every rank exit with
code 75 right after iteration k (k iterations done, after that iteration's checkpoint), the
deterministic stand-in for a run stopped by a failure."""

from __future__ import annotations

# ruff: noqa: E402 (the collector is switched off before the imports below, in a rank only)
import gc

if __name__ == "__main__":  # a rank: no collections while torch loads (see the end)
    gc.disable()

import os
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from topoagent.state.host import StateError
from topoagent.state.wire import LaunchSpec, load_launch_spec
from topocontract.buckets import BUCKET_PLAN_KEY, BucketPlanError, bucket_overlap_of
from topocontract.fusion import parse_fusion
from topocontract.hierarchy import HIERARCHY_KEY, HierarchyError, parse_hierarchy
from topotrain import checkpoint
from topotrain.buckets import PlannedBuckets, attach_buckets
from topotrain.collectives import load_schedule, register_hierarchy_hook, register_tree_hook
from topotrain.events import emit
from topotrain.fusion import apply_fusion
from topotrain.lifetime import hold, leave
from topotrain.pipeline import main as pipeline_main
from topotrain.sfb import SfbError, SfbLayers, attach_sfb
from topotrain.shares import loss_weight
from topotrain.workload import (
    check_same_weights,
    checksum,
    data_parallel,
    data_seed,
    load_factory,
    random_inputs,
)

EXIT_TEST_STOP = 75  # TOPO_TRAIN_EXIT_AFTER


def _emit(**event) -> None:
    emit(**event)  # on the event channel, not stdout (topotrain.events)


def main() -> int:
    """Train under the plan's job spec (DDP over gloo, or the pipeline runtime); the exit code.
    A job spec that is not a valid ``LaunchSpec`` is reported (file and YAML path), exit 1."""
    job = _load_job()
    if job is None:
        return 1
    if job.collective.get("algorithm") == "pipeline":  # a placed model: stages
        return pipeline_main(job)
    rank, world = _join_process_group(job)
    try:
        run = _prepare(job, rank, world)
        hold(run)  # its DDP reducer and hooks own process groups: never destroyed (lifetime)
    except (SfbError, BucketPlanError, HierarchyError) as e:  # the plan names what this
        # model or job does not have:
        # every rank builds the same model, so all of them stop here
        print(f"topotrain.train: {os.environ['TOPOCTL_JOB']}: {e}", file=sys.stderr)
        dist.destroy_process_group()
        return 1
    _train(run)
    if run.ckpt is not None:
        dist.barrier()  # every rank is past its last iteration: nothing can resume any more
        if run.local0:
            run.ckpt.remove()
    _emit(event="done", rank=rank, checksum=checksum(run.model))
    dist.destroy_process_group()
    return 0


def _load_job() -> LaunchSpec | None:
    """The launch spec $TOPOCTL_JOB names, or None after printing why it is not valid."""
    try:
        job = load_launch_spec(os.environ["TOPOCTL_JOB"])
        if not job.model.factory:
            raise StateError([("job.model.factory", "missing: the trainer builds the model "
                                                    "from it")]).at(os.environ["TOPOCTL_JOB"])
        parse_fusion(job.fusion, "job.fusion")  # checked before any rank joins the group
    except StateError as e:
        print(f"topotrain.train: {e}", file=sys.stderr)
        return None
    except ValueError as e:  # job.fusion (topocontract.fusion names the YAML path)
        print(f"topotrain.train: {os.environ['TOPOCTL_JOB']}: {e}", file=sys.stderr)
        return None
    return job


def _join_process_group(job: LaunchSpec) -> tuple[int, int]:
    """(rank, world size) after joining the job's gloo process group."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(job.threads)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=timedelta(seconds=120))
    # gloo binds the address the hostname resolves to: the launcher set it to `bind`
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    # destroy_process_group unregisters the group; this reference keeps its threads alive
    # until the rank leaves (topotrain.lifetime: joining them under the GIL can deadlock)
    hold(dist.group.WORLD)
    return rank, world


@dataclass
class _Run:
    """One rank's training: the model wrapped for the plan's collective, its optimizer, where
    it checkpoints and the first iteration (after a resume: the iterations already done)."""

    job: LaunchSpec
    rank: int
    world: int
    model: torch.nn.Module
    ddp: torch.nn.Module
    opt: torch.optim.Optimizer
    # the tree or hierarchical AllReduce hook (its per-bucket timings), None for DDP's own
    tree_hook: Any
    ckpt: checkpoint.CheckpointDir | None
    start: int
    sfb: SfbLayers | None = None  # the layers synchronised by SFB (`job.sfb`), None: none
    # the plan-named gradient buckets (`job.collective.bucket_plan`), None: DDP's own
    buckets: PlannedBuckets | None = None
    local0: bool = field(default_factory=lambda: os.environ.get("LOCAL_RANK", "0") == "0")


def _prepare(job: LaunchSpec, rank: int, world: int) -> _Run:
    """The model (the same initial weights on every rank, or the newest checkpoint's), wrapped
    in DDP with the plan's collective, and its optimizer."""
    torch.manual_seed(job.seed)  # the same initial weights on every rank
    model = load_factory(job.model.factory)(**job.model.kwargs)
    ckpt = _checkpoints(job, model, world)
    start, src, state = 0, 0, None
    if job.checkpoint.resume and ckpt is not None:
        start, src = checkpoint.agree(ckpt.latest())
        if start:
            state = ckpt.load(start) if rank == src else None
            checkpoint.restore_model(model, state, src)
    if not start:  # a resumed model came from one rank's checkpoint (`restore_model`)
        check_same_weights(model)
    # SFB layers first: their parameters then stay out of DDP's buckets
    sfb = attach_sfb(model, job.sfb) if job.sfb else None
    if job.fusion:  # the plan's regions compiled in place, before DDP or the buckets see it
        _fuse(job, model, rank)
    tree_hook, buckets = None, None
    trees = job.collective.get("algorithm") == "trees"
    hierarchy = parse_hierarchy(job.collective, job.processes)
    if hierarchy is not None and BUCKET_PLAN_KEY in job.collective:
        raise HierarchyError([(f"job.collective.{HIERARCHY_KEY}", "a hierarchical AllReduce "
                               "of plan-named buckets (bucket_plan) is not supported")])
    if BUCKET_PLAN_KEY in job.collective:  # the plan names the buckets: no DDP wrapper
        ddp = model
        opt = torch.optim.SGD(model.parameters(), lr=job.lr)
        if bucket_overlap_of(job.collective) == "forward" and job.sfb:
            raise BucketPlanError([("job.collective.bucket_overlap", "forward overlap with "
                                    "SFB layers is not supported (their gathers would "
                                    "interleave with the buckets' AllReduces)")])
        regions = parse_fusion(job.fusion, "job.fusion").regions if job.fusion else ()
        buckets = attach_buckets(model, job.collective, schedule=load_schedule(
            job.collective["schedule"]) if trees else None, optimizer=opt,
            regions=tuple(regions))
    else:
        ddp = data_parallel(model, job.bucket_cap_mb)
        if hierarchy is not None:  # several ranks per host: intra, inter, intra
            tree_hook = register_hierarchy_hook(ddp, hierarchy, load_schedule(
                job.collective["schedule"]) if trees else None)
        elif trees:
            tree_hook = register_tree_hook(ddp, load_schedule(job.collective["schedule"]))
        opt = torch.optim.SGD(ddp.parameters(), lr=job.lr)
    if start:
        checkpoint.restore_optimizer(opt, state, src)
        if rank == 0:
            _emit(event="resume", rank=rank, iteration=start, source=src)
    return _Run(job, rank, world, model, ddp, opt, tree_hook, ckpt, start, sfb=sfb,
                buckets=buckets)


def _fuse(job: LaunchSpec, model: torch.nn.Module, rank: int) -> None:
    """`job.fusion`'s regions compiled (`topotrain.fusion`), warmed up on a batch of this
    rank's shape drawn from a generator of its own (the training batches stay as they were);
    `job.fusion` was checked by `_load_job`."""
    plan = parse_fusion(job.fusion, "job.fusion")
    gen = torch.Generator().manual_seed(data_seed(job.seed, rank, -1))
    specs = [i.model_dump() for i in job.model.inputs]
    apply_fusion(model, plan, random_inputs(specs, job.batch.samples(rank), gen), rank)


def _train(run: _Run) -> None:
    """The iterations from `run.start` on, one `iter` event each, checkpointing every
    `checkpoint.every` (one writer per host's directory)."""
    job, rank = run.job, run.rank
    specs = [i.model_dump() for i in job.model.inputs]
    gen = torch.Generator()
    every = job.checkpoint.every
    writer = run.ckpt is not None and every > 0 and run.local0
    stop_after = int(os.environ.get("TOPO_TRAIN_EXIT_AFTER", "0") or 0)
    _emit(event="start", rank=rank, world=run.world,
          local_rank=int(os.environ.get("LOCAL_RANK", "0")), cpu_group=_cpu_group(),
          bind=os.environ.get("TOPOCTL_BIND_ADDRESS", "127.0.0.1"), iterations=job.iterations,
          algorithm=job.collective.get("algorithm", "default"), first=run.start)
    for it in range(run.start, job.iterations):
        gen.manual_seed(data_seed(job.seed, rank, it))
        # batch shares by speed: this rank's own share of the global batch
        inputs = random_inputs(specs, job.batch.samples(rank), gen)
        _emit(event="iter", rank=rank, iter=it,
              **_timed_iteration(run, inputs, last=it + 1 == job.iterations))
        done = it + 1
        if writer and done % every == 0 and done < job.iterations:
            if run.buckets is not None:  # forward overlap: the updates in flight applied
                run.buckets.flush()
            run.ckpt.save(done, run.model, run.opt)  # outside the timed part: it is over
        if stop_after and done == stop_after:
            # an abrupt stop, as a failure would: leaving through the interpreter's exit with
            # the process group alive lets gloo's threads abort the process (SIGABRT)
            sys.stdout.flush()
            os._exit(EXIT_TEST_STOP)


def _cpu_group() -> str | None:
    """The CPU control group this rank runs in, as the kernel's /proc/self/cgroup says (v1:
    the hierarchy with the `cpu` controller; v2: the unified one): the lab host's quota
    group when the lab started it. None when unreadable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    groups = {}
    for ln in lines:
        _, ctrl, path = ln.split(":", 2)
        groups["v2" if ctrl == "" else ctrl] = path
    v1 = [path for ctrl, path in groups.items() if "cpu" in ctrl.split(",")]
    return v1[0] if v1 else groups.get("v2")


def _timed_iteration(run: _Run, inputs: list[torch.Tensor], last: bool = False
                     ) -> dict[str, Any]:
    """One forward, backward (with DDP's AllReduces) and optimizer step; the `iter` event's
    timings. Forward overlap (`bucket_overlap: forward`): the runtime steps the optimizer
    per bucket in the next forward; the `last` iteration flushes (waits for) every bucket."""
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    run.opt.zero_grad(set_to_none=True)
    out = run.ddp(*inputs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    loss = out.float().pow(2).mean()
    weight = loss_weight(run.job.batch, run.rank, run.world)  # 1.0 unless batch shares
    t1, m1 = time.perf_counter(), time.thread_time()
    # DDP's AllReduces run inside the backward (the tree hook waits for its buckets)
    (loss * weight if weight != 1.0 else loss).backward()
    flush = 0.0
    if run.buckets is not None:  # plan-named buckets: started inside the backward, wait here
        run.buckets.finish()  # (forward overlap: the next forward waits instead)
        if last and run.buckets.overlap == "forward":
            # the last iteration's AllReduces, which the next forward would
            # have waited for, drained now: timed apart (`flush_seconds`), since an iteration
            # of the steady state (the period a plan predicts) has no such tail
            f0 = time.perf_counter()
            run.buckets.flush()
            flush = time.perf_counter() - f0
    if run.sfb is not None:  # the SFB layers' gradients from all ranks' factors
        run.sfb.sync()
    t2, m2 = time.perf_counter(), time.thread_time()
    if run.buckets is None or run.buckets.overlap != "forward":
        run.opt.step()
    m3 = time.thread_time()
    # cpu_seconds: this process's CPU (all its threads: gloo's and the tree runtime's
    # too, kernel time on its behalf included) during the iteration
    # end: wall clock (epoch seconds), so a reader can line iterations up with machine-wide
    # CPU samples (bench/planner/lab_check.py)
    t3 = time.perf_counter()
    seconds, cpu = t3 - t0 - flush, time.process_time() - c0
    # tree plans: per bucket [bytes, s waiting for the runtime's thread, s of AllReduce]
    extra = ({"allreduce": [[b, round(w, 6), round(r, 6)] for b, w, r in
                            run.tree_hook.take_timings()]} if run.tree_hook is not None else {})
    if run.buckets is not None:  # per bucket, in the order started (the plan's)
        extra["buckets"] = run.buckets.take_events()
        if run.buckets.slices is not None:  # per slice, in the order sent (by priority)
            extra["slices"] = run.buckets.take_slice_events()
        if last and run.buckets.overlap == "forward":
            extra["flush_seconds"] = round(flush, 6)
    if run.sfb is not None:  # seconds of the SFB gathers and products (inside `backward`)
        extra["sfb_seconds"] = round(run.sfb.seconds, 6)
    # phases: wall seconds of forward (with zero_grad and the loss), backward (with the
    # AllReduces DDP runs in it) and the optimizer step: a rank's own timeline
    phases = {"forward": round(t1 - t0, 6), "backward": round(t2 - t1 - flush, 6),
              "step": round(t3 - t2, 6)}
    # the same phases in CPU seconds of this (the main) thread: the model's compute, which
    # torch runs here with one thread; not the collectives' threads
    phases_cpu = {"forward": round(m1 - m0, 6), "backward": round(m2 - m1, 6),
                  "step": round(m3 - m2, 6)}
    return {"seconds": seconds, "cpu_seconds": round(cpu, 6), "loss": float(loss.detach()),
            "end": round(time.time(), 6), "phases": phases, "phases_cpu": phases_cpu, **extra}


def _checkpoints(job: LaunchSpec, model: torch.nn.Module, world: int
                 ) -> checkpoint.CheckpointDir | None:
    """This host's checkpoint directory when the job checkpoints or resumes, else None."""
    if not (job.checkpoint.every or job.checkpoint.resume):
        return None
    run_dir = os.environ.get("TOPOCTL_RUN_DIR") or str(Path(os.environ["TOPOCTL_JOB"]).parent)
    return checkpoint.CheckpointDir(Path(run_dir) / "checkpoints",
                                    checkpoint.identity(job.name, model, world))


if __name__ == "__main__":
    # A rank's start-up is mostly loading torch (1.3 s of CPU), then torch._dynamo, which
    # DistributedDataParallel's constructor imports (0.9 s): eight ranks on the lab's two
    # cores wait for it. Without collections during the imports, and with what they loaded
    # frozen out of every later collection (it lives as long as the rank), the collector no
    # longer walks torch's objects over and over: 0.2 s and 0.13 s less.
    gc.freeze()
    gc.enable()
    # leave without the interpreter's teardown or any process group's destructor (gloo's
    # threads can outlive destroy_process_group and abort a rank that has finished cleanly,
    # "terminate called without an active exception"; joining them under the GIL deadlocks:
    # topotrain.lifetime)
    leave(main())
