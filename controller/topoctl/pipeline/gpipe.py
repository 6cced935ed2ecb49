"""The GPipe iteration model (Huang et al., NeurIPS'19, "GPipe: efficient training of giant
neural networks using pipeline parallelism"): a pipeline's iteration as the simulator's tasks.

Per replica of every stage, `microbatches` forwards, then every backward in reverse (one
compute stream per host), activations and their gradients crossing consecutive stages as
flows on the fabric (`topocontract.stages.pieces` when replica counts differ), then each
stage's gradient sync over its replicas (`topocontract.stages`: ring, parameter server or
packed trees, `placement.stagesync`) and the optimiser step. With costs measured on this CPU
(`Measured`): every rank's tasks in its program's order, each message's CPU at both ends,
gloo's blocking sends, the runtime's CPU for the sync, and the lab's shared cores and cable
credit (`lab_network`, `stage_crowding`). One model for every pipeline planner: the
``placement``/``pipeline`` strategies, TAG's pipelines and the lab checks in bench/.

`pipeline_tasks` builds an iteration in named steps (`GPipeIteration`: inputs, forward and
backward passes, the messages between stages, the stages' syncs, the loss's AllReduce).
O(microbatches * replicas * stages + sync schedule) tasks. No I/O except the runtime's CPU
calibration the callers' contexts allow (`trees_cpu_model`, `measured_stage_costs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from topocontract.schedule import TreeSchedule
from topocontract.stages import pieces
from topoctl.collective.trees.pipeline import RuntimeCosts, runtime_costs
from topoctl.graph.cost import TrainCost, timing_grid
from topoctl.labprofile import LabProfile
from topoctl.placement.runtime import (
    allreduce_cpu,
    message_cpu,
    ps_cpu,
    shared_message_s,
    stage_costs,
)
from topoctl.placement.stagesync import sync_schedule, tree_cpu
from topoctl.sim.devices import split_device
from topoctl.sim.fabric import tcp_efficiency
from topoctl.sim.network import CpuPool, Network, as_cpu_pool
from topoctl.sim.tasks import Collective, Compute, Task, Transfer, sent
from topoctl.strategies import PlanContext
from topotrain.timing import load_calibration


def _cut_sums(ctx: PlanContext, stage_of: dict[str, int], nstages: int, weight
              ) -> list[float]:
    """Per boundary after each stage, the sum of `weight(op)` over the values crossing it (a
    value crosses every boundary from its stage to its last consumer's)."""
    last = {o.name: stage_of[o.name] for o in ctx.graph.ops}
    for o in ctx.graph.ops:
        for i in o.inputs:
            if i in last:
                last[i] = max(last[i], stage_of[o.name])
    out = [0] * max(0, nstages - 1)
    for o in ctx.graph.ops:
        for s in range(stage_of[o.name], last[o.name]):
            out[s] += weight(o)
    return out


def cut_bytes(ctx: PlanContext, stage_of: dict[str, int], nstages: int, scale: float
              ) -> list[float]:
    """Bytes crossing the boundary after each stage (all values live across it)."""
    return [float(x) for x in _cut_sums(ctx, stage_of, nstages, lambda o: o.out_bytes * scale)]


def cut_values(ctx: PlanContext, stage_of: dict[str, int], nstages: int) -> list[int]:
    """Values (tensors sent as one message each) crossing the boundary after each stage."""
    return _cut_sums(ctx, stage_of, nstages, lambda o: 1)


@dataclass(frozen=True)
class Measured:
    """What the pipeline costs on this machine's CPU (lab hosts): per-op training costs timed at
    the micro-batch (`graph.cost.TrainCost`) and the runtime's calibrated CPU costs per message
    (`placement.runtime`); `lab`: the lab machine every rank runs on (its cores shared, its
    cable emulation's cost per byte), None for ranks on machines of their own."""

    ops: dict[str, TrainCost]
    runtime: RuntimeCosts
    per_message_shared_s: float | None = None
    lab: LabProfile | None = None
    # CPU seconds a rank spends drawing the iteration's global batch (`topotrain.pipeline`
    # draws it on every rank), and the cores' crowding (`sim.network.CpuPool.crowding`)
    inputs_s: float = 0.0
    crowding: float = 0.0


def default_sync(group: list[str]) -> dict:
    """A stage's sync when none was chosen: gloo's ring over several replicas, else none."""
    return {"kind": "ring"} if len(group) > 1 else {"kind": "none"}


def sync_cpu(measured: Measured | None):
    """The CPU one replica spends in its stage's sync, `placement.stagesync.CpuCost`; None
    without measured runtime costs (the roofline: the network part only)."""
    if measured is None:
        return None

    def cpu(kind: str, nbytes: float, members: int, server: bool) -> float:
        args = (measured.runtime, measured.lab, measured.per_message_shared_s)
        if kind == "ps":
            return ps_cpu(nbytes, members, server, *args)
        return allreduce_cpu(nbytes, members, *args) if kind == "ring" else 0.0

    return cpu


def grad_bytes(ctx: PlanContext, stages: list[list[str]]) -> list[int]:
    """Gradient bytes of each stage (its ops' parameters)."""
    ops = ctx.graph.by_name()
    return [sum(ops[o].param_bytes for o in st) for st in stages]


def trees_cpu_model(ctx: PlanContext, measured: Measured | None):
    """The tree runtime's CPU per member of a stage (`placement.stagesync.tree_cpu`): the
    measured runtime costs and the lab machine with `measured`, else the machine's calibration
    (or the defaults) on machines of their own, as the whole-cluster `trees` strategy
    models it."""
    if measured is not None:
        return measured.runtime, measured.lab
    return runtime_costs(load_calibration() if ctx.use_cache else None), None


def lab_network(network: Network, hosts: list[str], measured: Measured | None,
                mtu: int, shared: tuple = ()) -> Network:
    """`network` as the lab runs it when `measured` says every rank runs on this machine:
    the compute of `hosts` (the simulator nodes the ranks run on: hosts, or devices) on the
    lab machine's shared cores (processor sharing, `Network.cpu_pool`), and every cable's
    link (not a device's intra-host link) with the token credit the lab shapes a cable of its
    line rate with (`Link.credit`, ``LabProfile.cable_credit_s`` at frames of `mtu` bytes;
    the links' capacities are goodput, `sim.fabric.tcp_efficiency`): a message that starts
    on a cable that idled passes its first bytes at once (measured,
    bench/results/lab-cable-credit-2026-11-28.txt). `shared`: the quotas that the ranks of a
    host of several share (`CpuPool.hosts`, `shared_quotas`): a stage's rank uses what its
    idle host-mates leave of their host's group, as in the lab."""
    if not measured or measured.lab is None:
        return network
    lab, eff = measured.lab, tcp_efficiency(mtu)
    # a lab host's devices talk over its loopback, which the lab does not shape: no credit
    links = {k: ln if _intra_host(ln.src, ln.dst) else
             replace(ln, credit=lab.cable_credit_s(ln.capacity * 8.0 / eff, mtu) * ln.capacity)
             for k, ln in network.links.items()}
    return replace(network, links=links, _cache={},
                   cpu_pool=CpuPool(frozenset(hosts), lab.cores, None, measured.crowding,
                                    tuple(shared)))


def shared_quotas(ctx: PlanContext) -> tuple:
    """The lab's hosts of several ranks and their quotas as the planner pooled them
    (`CpuPool.hosts`, `planner.lab_pool`); () for one rank per host or off the lab."""
    pool = as_cpu_pool(ctx.cpu_pool)
    return pool.hosts if pool is not None else ()


def _intra_host(a: str, b: str) -> bool:
    """Whether a link joins a device node (``h0/g1``) to its host (`sim.devices`)."""
    return split_device(a)[1] is not None or split_device(b)[1] is not None


def measured_stage_costs(ctx: PlanContext, micro_batch: int) -> Measured | None:
    """This CPU's costs for a micro-batch of `micro_batch` samples when the hosts are lab CPUs
    and the machine caches are allowed (`PlanContext.train_costs`), else None (per-op costs of
    the context, scaled)."""
    if ctx.train_costs is None:
        return None
    ops = ctx.train_costs(micro_batch, runtime="stage")  # as topotrain.pipeline runs a stage
    if ops is None:  # the model does not train on real tensors here: the context's costs
        return None
    cal = load_calibration()
    inputs = ctx.inputs_cost(ctx.job.batch.global_) if ctx.inputs_cost is not None else 0.0
    return Measured(ops, runtime_costs(cal), shared_message_s(cal), lab=ctx.lab,
                    inputs_s=inputs, crowding=stage_crowding(ctx))


def stage_crowding(ctx: PlanContext) -> float:
    """The lab cores' crowding (`sim.network.CpuPool.crowding`) for pipeline ranks: a stage's
    CPU time at the ranks' batch beside co-running copies (as many as the lab has other ranks,
    up to three times as many ranks as cores in all) over alone (`PlanContext.crowded_ratio`),
    less one, per unit of the oversubscription those copies make (``(copies + 1) / cores - 1``);
    0 when the lab's ranks (at most 4 per core, as `planner.lab_corun`) do not outnumber the
    cores or there is no timing. Stages are timed alone (`planner._lab_timing`: how many compute at
    once is what the plan decides) and the simulator slows them while they crowd. Measured on
    the 2-core Xeon VM for the lab MLP at 64 rows beside 5 copies: 0.12-0.15
    (docs/results.md)."""
    cores = ctx.lab.cores
    copies = min(ctx.world_size, 4 * cores) - 1
    if (copies + 1) / cores <= 1.0 or ctx.crowded_ratio is None:
        return 0.0
    # timed at three times as many ranks as cores at most: every copy more costs the first plan
    # on a machine seconds of timing (`make demo`'s budget), but at twice as many the ratio is
    # the scheduler's luck, not the crowding (2-core Xeon VM, lab MLP at 64 rows, four timings
    # in a row under the quiet lock: 1.002, 1.178, 1.045, 1.007 beside 3 copies; 1.292, 1.242,
    # 1.216 beside 5: crowding 0.002-0.178 against 0.108-0.146; 5.7 s against 8.4 s a timing)
    timed = min(copies, 3 * cores - 1)
    # one timing per model, at the grid point at or below the ranks' batch, whatever the
    # micro-batch: a ratio of two timings, which moved less between micro-batches (0.12-0.16 for
    # the lab MLP at 24-96 rows) than between runs, and each costs a first plan about 8 s
    # (three micro-batches took the demo's first planning from 26 to 52 s)
    ratio = ctx.crowded_ratio(timing_grid(ctx.local_batch)[0], timed)
    return max(0.0, (ratio - 1.0) / ((timed + 1) / cores - 1.0)) if ratio else 0.0



class GPipeIteration:
    """One GPipe iteration under construction (`pipeline_tasks` runs its steps in order): the
    tasks so far and each rank's last one (measured: a rank runs its program in order, one
    thread). `shares`: rows of each micro-batch per replica, per stage; `measured_at[rows]`:
    the costs timed at so many rows (all None: the context's per-op costs, `scale` per row)."""

    def __init__(self, ctx: PlanContext, stages: list[list[str]], groups: list[list[str]],
                 scale: float, shares: list[list[int]],
                 measured_at: Mapping[int, Measured | None]):
        self.ctx, self.stages, self.groups, self.shares = ctx, stages, groups, shares
        self.scale = scale
        self.base = next(iter(measured_at.values()), None)
        stage_of = {op: s for s, ops in enumerate(stages) for op in ops}
        self.k = len(stages)
        self.cut = cut_bytes(ctx, stage_of, self.k, scale)  # bytes per row
        self.nmsg = cut_values(ctx, stage_of, self.k)
        self.grads = grad_bytes(ctx, stages)
        self.per_stage = ({rows: [tuple(ctx.job.cost.scale * x for x in
                                        stage_costs(ctx.graph, stage_of, s, m.ops))
                                  for s in range(self.k)]
                           for rows, m in measured_at.items()} if self.base else None)
        self.links = [pieces(shares[b], shares[b + 1]) for b in range(self.k - 1)]
        self.tasks: list[Task] = []
        self.last: dict[str, str] = {}

    def cost(self, s: int, j: int, part: int) -> float:
        """Replica j of stage s: its forward (`part` 0), backward (1) or step (2, measured
        only) seconds at its rows."""
        rows, h = self.shares[s][j], self.groups[s][j]
        if self.per_stage:
            return self.per_stage[rows][s][part]
        c = self.ctx.host_costs(split_device(h)[0])  # a device runs its host's type
        return self.scale * rows * sum((c[o].fwd, c[o].bwd)[part] for o in self.stages[s])

    def message_cpu(self, b: int, rows: int) -> float:
        """CPU of one piece's messages across boundary b at one end (measured only)."""
        base = self.base
        if not base or not self.nmsg[b]:
            return 0.0
        return self.nmsg[b] * message_cpu(self.cut[b] * rows / self.nmsg[b], base.runtime,
                                          base.lab, base.per_message_shared_s)

    def compute(self, tid: str, h: str, seconds: float, deps: tuple[str, ...],
                runtime: bool = False) -> str:
        """A compute task on `h` after its previous one (measured); `runtime`: a runtime's
        own CPU (messages, the sync), `Compute.communication`."""
        if self.base and h in self.last:
            deps = (self.last[h],) + deps
        self.tasks.append(Compute(tid, h, seconds, deps, communication=runtime))
        self.last[h] = tid
        return tid

    def message(self, tid: str, src: str, dst: str, b: int, rows: int, after: str) -> str:
        """Transfer `tid` of `rows` rows across boundary b after `after`, the sender's CPU for
        it, then the receiver's; the id the receiver's next compute waits for. Measured:
        gloo's send is a rendezvous (its bytes go when the receiving rank has posted its
        receive, i.e. finished what its program does before: gloo's tcp ``Pair::send``
        notifies the peer and waits for its ``NOTIFY_RECV_READY``), and returns when its
        bytes are written to the socket; on the lab machine (``Measured.lab``) the socket
        takes up to ``LabProfile.send_buffer_bytes`` of them, so the sender goes on when
        the rest has left (`sim.tasks.sent`), the receiver when the last byte arrived.
        Elsewhere the sender waits for the delivery."""
        base = self.base
        ready = (after,) + ((self.last[dst],) if base and dst in self.last else ())
        buf = base.lab.send_buffer_bytes if base and base.lab is not None else None
        self.tasks.append(Transfer(tid, src, dst, self.cut[b] * rows, ready, buffer=buf))
        cpu = self.message_cpu(b, rows)
        if not cpu:
            return tid
        self.compute(f"{tid}/tx", src, cpu, (tid if buf is None else sent(tid),), True)
        return self.compute(f"{tid}/rx", dst, cpu, (tid,), True)

    def inputs(self) -> None:
        """Measured: every rank draws the iteration's global batch first
        (`Measured.inputs_s`)."""
        if not (self.base and self.base.inputs_s > 0):
            return
        for s in range(self.k):
            for j, h in enumerate(self.groups[s]):
                self.compute(f"in{s}.{j}", h, self.base.inputs_s, ())

    def forward_passes(self, micro: int) -> None:
        """Every micro-batch's forward through the stages, each replica after the pieces of
        its rows from the stage before (``act<boundary>.<m>.<from>.<to>``)."""
        groups = self.groups
        for m in range(micro):
            for s in range(self.k):
                for j, h in enumerate(groups[s]):
                    deps = tuple(self.message(f"act{s - 1}.{m}.{a}.{j}", groups[s - 1][a], h,
                                              s - 1, hi - lo, f"F{s - 1}.{m}.{a}")
                                 for a, i, lo, hi in self.links[s - 1] if i == j) if s else ()
                    self.compute(f"F{s}.{m}.{j}", h, self.cost(s, j, 0), deps)

    def backward_passes(self, micro: int) -> None:
        """The backwards in reverse micro-batch and stage order, each after its forward and
        the gradient pieces from the stage after (``grad<boundary>.<m>.<from>.<to>``)."""
        groups, k = self.groups, self.k
        for m in reversed(range(micro)):
            for s in reversed(range(k)):
                for j, h in enumerate(groups[s]):
                    deps = (f"F{s}.{m}.{j}",) + (tuple(
                        self.message(f"grad{s}.{m}.{i}.{j}", groups[s + 1][i], h, s, hi - lo,
                                     f"B{s + 1}.{m}.{i}")
                        for a, i, lo, hi in self.links[s] if a == j) if s + 1 < k else ())
                    self.compute(f"B{s}.{m}.{j}", h, self.cost(s, j, 1), deps)

    def stage_syncs(self, syncs: list[dict], micro: int) -> None:
        """Each stage's gradient sync over its replicas after all its backwards (`syncs`,
        `topocontract.stages`), the runtime's CPU for it (the tree runtime's while its
        chunks travel, `placement.stagesync`), then every replica's optimiser step."""
        ctx, groups, grads, base = self.ctx, self.groups, self.grads, self.base
        cpu = sync_cpu(base)
        tcpu = tree_cpu(*trees_cpu_model(ctx, base))
        for s in range(self.k):
            done = tuple(f"B{s}.{m}.{j}" for m in range(micro) for j in range(len(groups[s])))
            sched = sync_schedule(groups[s], syncs[s], float(grads[s]))
            trees = sched is not None and syncs[s]["kind"] == "trees"
            if trees:  # the tree runtime's CPU runs while its chunks travel (`stagesync`)
                for j, sec in enumerate(tcpu(TreeSchedule.model_validate(
                        syncs[s]["schedule"]), float(grads[s]))):
                    self.compute(f"ar{s}/cpu.{j}", groups[s][j], sec, done, True)
            if sched is not None:
                self.tasks.append(Collective(f"ar{s}", sched, done))
                done = (f"ar{s}",)
            for j, h in enumerate(groups[s]):
                if trees:
                    done = (f"ar{s}", f"ar{s}/cpu.{j}")
                elif cpu and sched is not None:  # the replicas' CPU for it, then the step
                    server = syncs[s]["kind"] == "ps" and syncs[s]["server"] == h
                    self.compute(f"ar{s}/cpu.{j}", h, cpu(syncs[s]["kind"], float(grads[s]),
                                                          len(groups[s]), server), done, True)
                self.compute(f"step{s}.{j}", h, self.step_seconds(s, j), done)

    def step_seconds(self, s: int, j: int) -> float:
        """Replica j of stage s's optimiser step: timed (measured), else its device's memory
        roofline over its gradients."""
        if self.per_stage:
            return self.per_stage[self.shares[s][j]][s][2]
        d = self.ctx.device[split_device(self.groups[s][j])[0]]
        return self.ctx.job.cost.scale * (d.launch + 4 * self.grads[s]
                                          / (d.mem_bw * d.efficiency))

    def loss_sync(self) -> None:
        """Measured: the last stage's replicas all-reduce the loss (gloo, one float)."""
        base, last = self.base, self.groups[-1]
        if not (base and len(last) > 1):
            return
        sec = allreduce_cpu(4.0, len(last), base.runtime, base.lab, base.per_message_shared_s)
        for j, h in enumerate(last):
            self.compute(f"loss.{j}", h, sec, (f"step{self.k - 1}.{j}",), True)


def pipeline_tasks(ctx: PlanContext, stages: list[list[str]], groups: list[list[str]],
                   micro: int, scale: float, measured: Measured | None = None,
                   syncs: list[dict] | None = None, shares: list[list[int]] | None = None,
                   measured_at: Mapping[int, Measured] | None = None
                   ) -> tuple[list[Task], list[int]]:
    """One GPipe iteration per replica, then per-stage gradient sync and step (module
    docstring); `syncs`: each stage's (`topocontract.stages`; default: `default_sync`).
    With `measured`: stage compute from ops timed at the micro-batch (`placement.runtime`),
    every rank's tasks in its program's order (the runtime is one thread: receive, forward,
    send per micro-batch, then the backwards in reverse), every message's CPU cost on the
    sending and the receiving rank, sends blocking as gloo's do
    (`GPipeIteration.message`), the replicas' CPU for their gradient AllReduce after its
    network part; simulate it on `lab_network` so that the lab's ranks share the machine's
    cores.

    Stages of unequal replica counts (`shares`: rows of each micro-batch per replica, per
    stage, `topocontract.stages`): `scale` is then that of one row, `measured_at[rows]` the
    costs timed at each replica's rows, and each boundary moves the row pieces the runtime
    sends (`topocontract.stages.pieces`), a message per value and piece. Without `shares`
    every stage has the same replicas and each takes the micro-batch `scale` describes.
    Returns (tasks, gradient bytes per stage)."""
    if shares is None:  # the equal-count plan: one "row" = a replica's micro-batch
        shares, measured_at = [[1] * len(grp) for grp in groups], {1: measured}
    it = GPipeIteration(ctx, stages, groups, scale, shares, measured_at or {})
    it.inputs()
    it.forward_passes(micro)
    it.backward_passes(micro)
    it.stage_syncs(syncs or [default_sync(grp) for grp in groups], micro)
    it.loss_sync()
    return it.tasks, it.grads
