"""Pipeline training for plans whose collective is `pipeline`: each rank runs one stage (a set
of the model's fx ops) for one replica, activations and their gradients go point to point
(gloo send/recv between the hosts' training addresses), stages with several replicas
all-reduce their gradients over their group.

The plan's `job.collective`: `stages` (per stage: `ranks` (one per replica), `ops` (fx node
names)), `microbatches`, `micro_batch` (samples), `replicas`. Every rank builds the whole model
with the same seed (only its stage's parameters are ever updated) and traces it with torch.fx,
so node names match the plan; a run on the `meta` device gives every value's shape and dtype
at the micro-batch size (receive buffers) and every non-tensor value (sizes), which are
constants. Schedule: GPipe (Huang et al., NeurIPS'19): all forwards, then all backwards in
reverse micro-batch order, then the group AllReduce and the optimiser step.

Boundary b (between stage b and b+1) carries every value produced at a stage <= b and read at
a stage > b, in fx order: values a later stage needs pass through the stages in between, as
the planner's simulator charges them. Gradients come back for the floating-point ones.

Replicas of a stage synchronise their gradients as the stage's `sync` says
(`topocontract.stages`: none, ring, or a parameter server on one of its hosts;
`topotrain.stagesync` runs it).

Data and loss: iteration i uses the global batch `batch_inputs(specs, global, i, seed)` (the
same on every rank); replica r takes its contiguous share and splits it into micro-batches;
the loss is mean(out^2) over the global batch, so the gradients and the losses equal those of
single-process training on the same batch (up to fp32 summation order). This module imports
nothing of the controller."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import fx

from topocontract.stages import sync_of, sync_problems, tree_schedule
from topotrain.events import emit
from topotrain.stagesync import sync_grads
from topotrain.workload import checksum, load_factory, random_inputs

if TYPE_CHECKING:
    from topoagent.state.wire import LaunchSpec


def _emit(**event) -> None:
    emit(**event)  # on the event channel, not stdout (topotrain.events)


class PipelineSpecError(ValueError):
    """The plan's pipeline collective does not match the model (unknown ops, bad stages)."""

    pass


def batch_inputs(specs: list[dict], batch: int, iteration: int, seed: int = 0):
    """The global batch of one iteration: identical on every rank and in a reference run."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    return random_inputs(specs, batch, gen)


def meta_values(model_factory, kwargs: dict, specs: list[dict], micro: int) -> dict:
    """Every node's value on the meta device at the micro-batch size: tensors as (shape,
    dtype) templates, everything else (sizes, shapes) as the value itself."""
    with torch.device("meta"):
        model = model_factory(**kwargs)
    gm = fx.symbolic_trace(model)
    ins = []
    for s in specs:
        dt = torch.int64 if s.get("dtype", "float32").startswith("int") else torch.float32
        ins.append(torch.empty((micro, *s["shape"]), dtype=dt, device="meta"))
    values: dict[str, object] = {}

    class Rec(fx.Interpreter):
        def run_node(self, n):
            v = super().run_node(n)
            values[n.name] = v
            return v

    with torch.no_grad():
        Rec(gm).run(*ins)
    return values


def _flat(v) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)) and v and all(isinstance(x, torch.Tensor) for x in v):
        return list(v)
    return []


def _rebuild(template, tensors: list):
    if isinstance(template, torch.Tensor):
        return tensors[0]
    return type(template)(tensors)


class Stage:
    """One rank's stage: which nodes it runs and what crosses its two boundaries."""

    def __init__(self, gm, stage_ops: list[list[str]], s: int, meta: dict):
        self.gm = gm
        self.s = s
        self.k = len(stage_ops)
        stage_of = {op: i for i, ops in enumerate(stage_ops) for op in ops}
        nodes = list(gm.graph.nodes)
        missing = [n.name for n in nodes if n.name not in stage_of]
        if missing:
            raise PipelineSpecError(f"ops not in any stage: {', '.join(missing[:5])} (plan and "
                                    "model differ)")
        last = {n.name: stage_of[n.name] for n in nodes}
        for n in nodes:
            for a in n.all_input_nodes:
                last[a.name] = max(last[a.name], stage_of[n.name])
        self.mine = [n for n in nodes if stage_of[n.name] == s]
        # boundary b: produced at <= b, read at > b
        self.cross = {b: [n.name for n in nodes if stage_of[n.name] <= b < last[n.name]]
                      for b in range(self.k - 1)}
        self.meta = meta
        self.placeholders = [n.name for n in nodes if n.op == "placeholder"]
        self.output = next(n for n in nodes if n.op == "output")

    def incoming(self) -> list[str]:
        """Names of the values this stage receives from the previous one."""
        return self.cross.get(self.s - 1, [])

    def outgoing(self) -> list[str]:
        """Names of the values this stage sends to the next one."""
        return self.cross.get(self.s, [])


def _templates(stage: Stage, names: list[str]) -> list:
    """(name, [tensor templates]) for the names that carry tensors."""
    out = []
    for name in names:
        ts = _flat(stage.meta[name])
        if ts:
            out.append((name, ts))
    return out


def main(job: LaunchSpec) -> int:
    """Run this rank's pipeline stage for the job's iterations (GPipe schedule); the exit code."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    bind = os.environ.get("TOPOCTL_BIND_ADDRESS", "127.0.0.1")
    torch.set_num_threads(job.threads)
    coll = job.collective
    bad = sync_problems(coll)
    if bad:
        raise PipelineSpecError("; ".join(f"{p}: {m}" for p, m in bad))
    stages = coll["stages"]
    where = [(s, r) for s, st in enumerate(stages) for r, x in enumerate(st["ranks"]) if x == rank]
    if not where:  # the renderer launches only stage ranks: a plan edited by hand
        raise PipelineSpecError(f"rank {rank} is in no stage of the plan's collective")
    k, g = len(stages), len(stages[0]["ranks"])
    micro, m_count = int(coll["micro_batch"]), int(coll["microbatches"])
    # generous: under load, importing torch in every rank takes a while
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    groups = [dist.new_group(st["ranks"]) for st in stages]  # every rank creates every group
    s, r = where[0]
    spec = job.model
    inputs_spec = [i.model_dump() for i in spec.inputs]
    factory = load_factory(spec.factory)
    seed = job.seed
    torch.manual_seed(seed)
    model = factory(**spec.kwargs)
    gm = fx.symbolic_trace(model)
    stage = Stage(gm, [st["ops"] for st in stages], s, meta_values(
        factory, spec.kwargs, inputs_spec, micro))
    prev = stages[s - 1]["ranks"][r] if s else None
    nxt = stages[s + 1]["ranks"][r] if s + 1 < k else None
    opt = torch.optim.SGD(model.parameters(), lr=job.lr)
    kind, server = sync_of(stages[s])
    server_rank = stages[s]["ranks"][server] if server is not None else None
    trees = tree_schedule(stages[s]) if kind == "trees" else None
    global_batch = micro * m_count * g
    iters = job.iterations
    _emit(event="start", rank=rank, world=world, bind=bind, iterations=iters,
          algorithm="pipeline", stage=s, replica=r, sync=kind)
    for it in range(iters):
        full = batch_inputs(inputs_spec, global_batch, it, seed)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        micro_inputs = [[x[(r * m_count + m) * micro:(r * m_count + m + 1) * micro]
                         for x in full] for m in range(m_count)]
        loss_sum, fwd_s, _ = gpipe_passes(stage, micro_inputs, prev, nxt, g * m_count, dist)
        t_fwd = t0 + fwd_s
        t_bwd = time.perf_counter()
        sync_grads(model, kind, stages[s]["ranks"], server_rank, rank, groups[s], dist, trees)
        t_ar = time.perf_counter()
        opt.step()
        seconds = time.perf_counter() - t0
        loss_val = None
        if s == k - 1:
            t = torch.tensor([loss_sum])
            if g > 1:
                dist.all_reduce(t, group=groups[s])
            loss_val = float(t) / (g * m_count)
        # phases (wall seconds, sends and receives included): forwards, backwards, the
        # replicas' gradient AllReduce, the optimiser step
        _emit(event="iter", rank=rank, iter=it, seconds=seconds, loss=loss_val, stage=s,
              cpu_seconds=round(time.process_time() - c0, 6), end=round(time.time(), 6),
              phases={"forward": round(t_fwd - t0, 6), "backward": round(t_bwd - t_fwd, 6),
                      "allreduce": round(t_ar - t_bwd, 6),
                      "step": round(seconds - (t_ar - t0), 6)})
    _emit(event="done", rank=rank, checksum=checksum(model), stage=s)
    dist.destroy_process_group()
    return 0


def gpipe_passes(stage: Stage, micro_inputs: list[list], prev: int | None, nxt: int | None,
                 parts: int, dist=None, clock=time.perf_counter) -> tuple[float, float, float]:
    """One iteration's passes of this rank's stage, GPipe order: the forward of every
    micro-batch (`micro_inputs`: each micro-batch's model inputs), then their backwards in
    reverse order, receiving from rank `prev` and sending to rank `nxt` (None: no such
    neighbour; a one-stage pipeline needs no `dist`). The loss is divided by `parts` (micro-
    batches x replicas). Returns (the sum of the micro-batch losses on the last stage, else
    0.0; forward seconds; backward seconds, by `clock`). `main` runs it, and the planner times
    a one-stage pipeline with it, so that its prediction includes this path's own cost."""
    t0 = clock()
    saved = []
    loss_sum = 0.0
    for inputs in micro_inputs:
        loss, received, sent = _forward(stage, inputs, prev, nxt, dist, torch)
        if loss is not None:
            loss_sum += float(loss.detach())
        saved.append((loss, received, sent))
    t1 = clock()
    for m in reversed(range(len(saved))):
        loss, received, sent = saved[m]
        _backward(loss, received, sent, prev, nxt, parts, dist, torch)
        saved[m] = None
    return loss_sum, t1 - t0, clock() - t1


def _forward(stage: Stage, inputs, prev, nxt, dist, torch):
    """Run this stage's nodes on one micro-batch; returns (loss or None, received leaves,
    sent tensors that carry gradients)."""
    interp = fx.Interpreter(stage.gm)
    env = interp.env
    by_name = {n.name: n for n in stage.gm.graph.nodes}
    received = []
    for name in stage.incoming():
        ts = _flat(stage.meta[name])
        if not ts:  # a size or shape: the same constant everywhere
            env[by_name[name]] = stage.meta[name]
            continue
        got = []
        for t in ts:
            buf = torch.empty(t.shape, dtype=t.dtype)
            dist.recv(buf, prev)
            if buf.is_floating_point():
                buf.requires_grad_(True)
                received.append(buf)
            got.append(buf)
        env[by_name[name]] = _rebuild(stage.meta[name], got)
    loss = None
    for n in stage.mine:
        if n.op == "placeholder":
            env[n] = inputs[stage.placeholders.index(n.name)]
        elif n.op == "output":
            out = interp.run_node(n)
            out = out[0] if isinstance(out, (tuple, list)) else out
            loss = out.float().pow(2).mean()
        else:
            env[n] = interp.run_node(n)
    sent = []
    for name in stage.outgoing():
        for t in _flat(env[by_name[name]]):
            dist.send(t.detach().contiguous(), nxt)
            if t.is_floating_point():
                sent.append(t)
    return loss, received, sent


def _backward(loss, received, sent, prev, nxt, parts: int, dist, torch) -> None:
    """Backward of one micro-batch: the loss share on the last stage, the gradients of what
    this stage sent from the next one, then the gradients of what it received to the previous
    one (zeros where nothing here used a value)."""
    roots, grads = [], []
    if loss is not None:
        roots.append(loss / parts)
        grads.append(torch.ones(()))
    for t in sent:
        gbuf = torch.empty(t.shape, dtype=t.dtype)
        dist.recv(gbuf, nxt)
        if t.requires_grad:
            roots.append(t)
            grads.append(gbuf)
    if roots:
        torch.autograd.backward(roots, grads)
    for t in received:
        gsend = t.grad if t.grad is not None else torch.zeros_like(t)
        dist.send(gsend.contiguous(), prev)

