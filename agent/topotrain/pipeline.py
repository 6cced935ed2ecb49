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

Replica counts may differ between stages (`topocontract.stages`: each stage's `shares`, the
rows of every micro-batch its replicas take): a boundary whose two stages split the micro-batch
the same way pairs replica r with replica r and sends whole tensors; otherwise each replica
sends every (batch-major) tensor's rows to the replicas of the next stage that take them and
gathers the gradients of those rows back (`topocontract.stages.pieces`), the receiving side
concatenating the pieces in row order.

Data and loss: iteration i uses the global batch `batch_inputs(specs, global, i, seed)` (the
same on every rank); micro-batch m is its rows [m T, (m + 1) T) and each replica takes its
contiguous rows of it; a replica's loss is weighted by its rows / (T x micro-batches), and the
loss is mean(out^2) over the global batch, so the gradients and the losses equal those of
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

from topocontract.stages import pieces, stage_shares, sync_of, sync_problems, tree_schedule
from topotrain.events import emit
from topotrain.lifetime import hold
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
        self.rows: int | None = None  # this replica's rows of a micro-batch (`main` sets it)
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


def _links(shares: list[list[int]], ranks: list[list[int]], s: int, r: int):
    """(prev, nxt) of replica r of stage s: a peer's rank where the boundary pairs whole
    replicas (same rows on both sides), else the pieces (peer rank, first row, end row) in this
    replica's own rows (`topocontract.stages.pieces`); None at the pipeline's ends."""
    lo = sum(shares[s][:r])

    def side(b: int, sends: bool):
        peers = ranks[b + 1] if sends else ranks[b]
        if shares[b] == shares[b + 1]:  # the same rows on both sides: replica to replica
            return peers[r]
        return [(peers[i if sends else j], a - lo, z - lo)
                for j, i, a, z in pieces(shares[b], shares[b + 1]) if (j if sends else i) == r]

    prev = side(s - 1, False) if s else None
    nxt = side(s, True) if s + 1 < len(shares) else None
    return prev, nxt


def _check_batch_major(stage: Stage, factory, kwargs: dict, specs: list[dict], prev, nxt,
                       ) -> None:
    """Values split by rows across a boundary must grow along dim 0 with the rows."""
    names = ((stage.incoming() if isinstance(prev, list) else [])
             + (stage.outgoing() if isinstance(nxt, list) else []))
    if not names:
        return
    more = meta_values(factory, kwargs, specs, stage.rows + 1)
    for name in names:
        for a, b in zip(_flat(stage.meta[name]), _flat(more[name]), strict=True):
            c = a.shape[0] // stage.rows if a.dim() else 0
            if (not a.dim() or a.shape[0] != c * stage.rows or b.shape[0] != c * (stage.rows + 1)
                    or a.shape[1:] != b.shape[1:]):
                raise PipelineSpecError(
                    f"value {name} crosses a boundary whose stages split the micro-batch "
                    f"differently, but its dim 0 does not grow with the rows ({tuple(a.shape)})")


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
    k, m_count = len(stages), int(coll["microbatches"])
    shares = stage_shares(coll)
    total = sum(shares[0])  # rows of one micro-batch
    # generous: under load, importing torch in every rank takes a while
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          rank == 0, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    groups = [dist.new_group(st["ranks"]) for st in stages]  # every rank creates every group
    hold(dist.group.WORLD, groups)  # alive until the rank leaves (topotrain.lifetime)
    s, r = where[0]
    rows, lo = shares[s][r], sum(shares[s][:r])
    spec = job.model
    inputs_spec = [i.model_dump() for i in spec.inputs]
    factory = load_factory(spec.factory)
    seed = job.seed
    torch.manual_seed(seed)
    model = factory(**spec.kwargs)
    gm = fx.symbolic_trace(model)
    stage = Stage(gm, [st["ops"] for st in stages], s, meta_values(
        factory, spec.kwargs, inputs_spec, rows))
    stage.rows = rows
    prev, nxt = _links(shares, [st["ranks"] for st in stages], s, r)
    _check_batch_major(stage, factory, spec.kwargs, inputs_spec, prev, nxt)
    opt = torch.optim.SGD(model.parameters(), lr=job.lr)
    kind, server = sync_of(stages[s])
    server_rank = stages[s]["ranks"][server] if server is not None else None
    trees = tree_schedule(stages[s]) if kind == "trees" else None
    iters = job.iterations
    _emit(event="start", rank=rank, world=world, bind=bind, iterations=iters,
          algorithm="pipeline", stage=s, replica=r, sync=kind, rows=rows)
    # an iteration runs from the end of the one before (the loop's start for the first): the
    # iterations tile the loop, so a rank that waits between its stage's passes (the last
    # stage's loss all-reduce waits for its slowest replica: behind a slow cable, gloo's ring
    # lets the others leave it 0.1 s earlier) counts the wait, and every rank's period is
    # the job's (`RunResult.iteration_time` averages the ranks)
    t_prev, c_prev = time.perf_counter(), time.process_time()
    for it in range(iters):
        full = batch_inputs(inputs_spec, total * m_count, it, seed)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        micro_inputs = [[x[m * total + lo:m * total + lo + rows] for x in full]
                        for m in range(m_count)]
        # the loss of these rows weighs rows / (total x micro-batches) of the batch's mean
        _MESSAGE_CPU[0] = 0.0
        loss_sum, fwd_s, _ = gpipe_passes(stage, micro_inputs, prev, nxt,
                                          total * m_count / rows, dist)
        t_fwd = t0 + fwd_s
        t_bwd, c_bwd = time.perf_counter(), time.process_time()
        sync_grads(model, kind, stages[s]["ranks"], server_rank, rank, groups[s], dist, trees)
        t_ar, c_ar = time.perf_counter(), time.process_time()
        opt.step()
        t_step, c_step = time.perf_counter(), time.process_time()
        loss_val = None
        if s == k - 1:
            t = torch.tensor([loss_sum * rows / total])
            if len(stages[s]["ranks"]) > 1:
                dist.all_reduce(t, group=groups[s])
            loss_val = float(t) / m_count
        t_end, wall_end, c_end = time.perf_counter(), time.time(), time.process_time()
        # phases (wall seconds, sends and receives included): forwards, backwards, the
        # replicas' gradient AllReduce, the optimiser step, and the rest ("other": the
        # next batch's inputs, the last stage's loss all-reduce with its wait); they sum
        # to `seconds`. phases_cpu: the same in this process's CPU seconds (all its threads,
        # gloo's too, and kernel time on its behalf), forward and backward together ("passes"),
        # of which the sends and receives between stages ("messages")
        _emit(event="iter", rank=rank, iter=it, seconds=t_end - t_prev, loss=loss_val,
              stage=s, cpu_seconds=round(c_end - c_prev, 6), end=round(wall_end, 6),
              phases={"forward": round(t_fwd - t0, 6), "backward": round(t_bwd - t_fwd, 6),
                      "allreduce": round(t_ar - t_bwd, 6), "step": round(t_step - t_ar, 6),
                      "other": round((t0 - t_prev) + (t_end - t_step), 6)},
              phases_cpu={"passes": round(c_bwd - c0, 6), "messages": round(_MESSAGE_CPU[0], 6),
                          "allreduce": round(c_ar - c_bwd, 6),
                          "step": round(c_step - c_ar, 6),
                          "other": round((c0 - c_prev) + (c_end - c_step), 6)})
        t_prev, c_prev = t_end, c_end
    _emit(event="done", rank=rank, checksum=checksum(model), stage=s)
    dist.destroy_process_group()
    return 0


def gpipe_passes(stage: Stage, micro_inputs: list[list], prev, nxt,
                 parts: float, dist=None, clock=time.perf_counter) -> tuple[float, float, float]:
    """One iteration's passes of this rank's stage, GPipe order: the forward of every
    micro-batch (`micro_inputs`: each micro-batch's model inputs), then their backwards in
    reverse order, receiving from `prev` and sending to `nxt` (a rank, or the row pieces of
    `_links`; None: no such neighbour; a one-stage pipeline needs no `dist`). The loss is
    divided by `parts` (micro-batches x replicas: the batch's rows over this replica's).
    Returns (the sum of the micro-batch losses on the last stage, else
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
        _backward(loss, received, sent, prev, nxt, parts, dist, torch,
                  stage.rows)
        saved[m] = None
    return loss_sum, t1 - t0, clock() - t1


def _rows_factor(t, rows: int) -> int:
    """Tensor rows per micro-batch row of a batch-major value (dim 0 = factor x rows)."""
    return t.shape[0] // rows


_MESSAGE_CPU = [0.0]  # this process's CPU seconds inside the stages' sends and receives


def _timed_message(op, *args) -> None:
    """`op(*args)` (a gloo send or receive), its process CPU time added to `_MESSAGE_CPU`."""
    c = time.process_time()
    op(*args)
    _MESSAGE_CPU[0] += time.process_time() - c


def _recv_value(template, prev, rows: int, dist, torch):
    """One tensor from the previous stage: whole from one peer, or its row pieces gathered."""
    if not isinstance(prev, list):
        buf = torch.empty(template.shape, dtype=template.dtype)
        _timed_message(dist.recv, buf, prev)
        return buf
    c = _rows_factor(template, rows)
    parts = []
    for peer, a, z in prev:
        part = torch.empty((c * (z - a), *template.shape[1:]), dtype=template.dtype)
        _timed_message(dist.recv, part, peer)
        parts.append(part)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _send_value(t, link, rows: int, dist) -> None:
    """One tensor to its peer whole, or its row pieces to the peers that take them."""
    if not isinstance(link, list):
        _timed_message(dist.send, t.contiguous(), link)
        return
    c = _rows_factor(t, rows)
    for peer, a, z in link:
        _timed_message(dist.send, t[c * a:c * z].contiguous(), peer)


def _forward(stage: Stage, inputs, prev, nxt, dist, torch):
    """Run this stage's nodes on one micro-batch; returns (loss or None, received leaves,
    sent tensors that carry gradients)."""
    interp = fx.Interpreter(stage.gm)
    env = interp.env
    by_name = {n.name: n for n in stage.gm.graph.nodes}
    rows = stage.rows
    received = []
    for name in stage.incoming():
        ts = _flat(stage.meta[name])
        if not ts:  # a size or shape: the same constant everywhere
            env[by_name[name]] = stage.meta[name]
            continue
        got = []
        for t in ts:
            buf = _recv_value(t, prev, rows, dist, torch)
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
            _send_value(t.detach(), nxt, rows, dist)
            if t.is_floating_point():
                sent.append(t)
    return loss, received, sent


def _backward(loss, received, sent, prev, nxt, parts: float, dist, torch, rows=None) -> None:
    """Backward of one micro-batch: the loss share on the last stage, the gradients of what
    this stage sent from the next one (gathered by rows where the next stage splits them
    differently), then the gradients of what it received to the previous one (zeros where
    nothing here used a value; split by rows likewise)."""
    roots, grads = [], []
    if loss is not None:
        roots.append(loss / parts)
        grads.append(torch.ones(()))
    for t in sent:
        gbuf = _recv_value(t, nxt, rows, dist, torch)
        if t.requires_grad:
            roots.append(t)
            grads.append(gbuf)
    if roots:
        torch.autograd.backward(roots, grads)
    for t in received:
        gsend = t.grad if t.grad is not None else torch.zeros_like(t)
        _send_value(gsend, prev, rows, dist)
