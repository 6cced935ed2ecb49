"""Cost model of the pipeline runtime (``topotrain.pipeline``) on CPU hosts: what a stage's
micro-batch costs when its ops are timed on this CPU, and what a point-to-point message costs
the CPU. Pure functions over plain data; no I/O.

A stage's forward is the sum of its ops' measured forward times at the micro-batch size
(``graph.cost.TrainCost``, timed at exactly that batch: no linear scaling). Its backward charges
each op the backward autograd really runs: ``bwd_inputs`` when one of the op's inputs needs a
gradient, else ``bwd_params`` (only its parameters' gradients; nothing for a parameter-free op
on constants). A value needs a gradient when it was produced in this stage by an op with
parameters or from a value that needs one, or when the stage received it from an earlier stage
and it is floating point (the runtime makes received floats leaves that require a gradient, so
their gradient can be sent back). The optimiser step is the sum of the ops' measured steps.

A message (one tensor sent or received with gloo) costs its rank ``per_message_s +
bytes / wire_bytes_per_s`` of CPU (``topotrain.collectives.calibrate``: the same figures the
tree runtime's model uses). In the lab a byte also costs the cables' emulation (veth, tc
shaping, TCP at both ends: the ``emulation_bytes_per_s`` of the
``topoctl.labprofile.LabProfile`` passed in), and every rank runs on the lab machine's
``cores`` cores: the simulator shares them among the ranks' compute (``Network.cpu_pool``,
processor sharing). A hybrid's replicas all-reduce their stage's gradients with gloo:
``allreduce_cpu`` is what that costs each of them on top of the ring's network time, ``ps_cpu``
what a parameter server's sync (``topotrain.stagesync``) costs the server and each worker.
O(ops) per stage.
"""

from __future__ import annotations

from collections.abc import Mapping

from topoctl.collective.trees.pipeline import RuntimeCosts
from topoctl.graph.cost import OpCost, TrainCost, whole_step_backward
from topoctl.graph.ops import OpGraph
from topoctl.labprofile import LabProfile
from topoctl.sim.network import MessageCost

__all__ = ["allreduce_cpu", "message_cost", "message_cpu", "needs_grad", "ps_cpu",
           "rank_op_costs", "shared_message_s", "stage_costs"]


def _is_float(graph: OpGraph, name: str) -> bool:
    """Floating point when its elements have the graph's dtype width (int64 ids are 8 bytes)."""
    op = graph.by_name()[name]
    n = 1
    for d in op.out_shape:
        n *= d
    return n == 0 or op.out_bytes == n * graph.dtype_bytes


def needs_grad(graph: OpGraph, stage_of: Mapping[str, int], s: int) -> dict[str, bool]:
    """For every value stage ``s`` produces or receives: does autograd need its gradient there
    (module docstring)? Values of other stages that ``s`` does not read are left out."""
    ops = graph.by_name()
    out: dict[str, bool] = {}
    for o in graph.ops:  # fx order is topological
        for i in o.inputs:
            if i in ops and stage_of[i] < s and stage_of[o.name] == s and i not in out:
                out[i] = _is_float(graph, i)
        if stage_of[o.name] != s:
            continue
        out[o.name] = o.kind != "placeholder" and (
            o.param_bytes > 0 or any(out.get(i, False) for i in o.inputs))
    return out


def stage_costs(graph: OpGraph, stage_of: Mapping[str, int], s: int,
                measured: Mapping[str, TrainCost]) -> tuple[float, float, float]:
    """(forward, backward, step) seconds of stage ``s`` for one micro-batch (step: once per
    iteration) from per-op costs measured at the micro-batch size."""
    grad = needs_grad(graph, stage_of, s)
    fwd = bwd = step = 0.0
    for o in graph.ops:
        if stage_of[o.name] != s:
            continue
        c = measured[o.name]
        fwd += c.fwd
        step += c.step
        bwd += c.bwd_inputs if any(grad.get(i, False) for i in o.inputs) else c.bwd_params
    return fwd, bwd, step


def rank_op_costs(graph: OpGraph, measured: Mapping[str, TrainCost],
                  scale: float = 1.0) -> tuple[dict[str, OpCost], float]:
    """(per-op forward/backward seconds, optimiser step seconds) of a data-parallel rank whose
    ops were timed on this CPU at its batch: the whole model is one stage, so an op's backward
    is the one autograd runs (``graph.cost.whole_step_backward``). `scale`: the job's
    ``cost.scale``. O(ops)."""
    bwd = whole_step_backward(graph, dict(measured))
    out = {o.name: OpCost(scale * measured[o.name].fwd, scale * bwd[o.name]) for o in graph.ops}
    return out, scale * sum(measured[o.name].step for o in graph.ops)


def shared_message_s(calibration: Mapping | None) -> float | None:
    """The runtime calibration's per-message CPU measured with ranks sharing the cores
    (``per_message_shared_s``), None when it has none (or there is no calibration)."""
    shared = (calibration or {}).get("per_message_shared_s")
    return float(shared) if isinstance(shared, (int, float)) else None


def message_cost(costs: RuntimeCosts, lab: LabProfile | None = None,
                 per_message_shared_s: float | None = None) -> MessageCost:
    """`message_cpu` as the simulator's `MessageCost` (per message, bytes per CPU-second), for
    `CpuPool.messages`: what the engine charges each end of a collective's step. O(1)."""
    per = (per_message_shared_s if lab is not None and per_message_shared_s
           else costs.per_message_s)
    rate = lab.wire_rate(costs.wire_bytes_per_s) if lab is not None else costs.wire_bytes_per_s
    return MessageCost(per, rate)


def message_cpu(nbytes: float, costs: RuntimeCosts, lab: LabProfile | None = None,
                per_message_shared_s: float | None = None) -> float:
    """CPU seconds one rank spends sending or receiving one tensor of ``nbytes`` with gloo.
    ``lab``: every rank on that lab machine, oversubscribing its cores: the calibration's
    shared per-message figure when it has one (it includes the context switch of every
    blocking wait), and a byte also costs the cable emulation, counted half at each end as the
    tree runtime's model does (``LabProfile.wire_rate``); None: a rank with a machine of its
    own."""
    return message_cost(costs, lab, per_message_shared_s).seconds(nbytes)


def allreduce_cpu(nbytes: float, members: int, costs: RuntimeCosts,
                  lab: LabProfile | None = None,
                  per_message_shared_s: float | None = None) -> float:
    """CPU seconds one replica spends in its stage's gradient AllReduce (the runtime flattens
    the gradients into one buffer, gloo all-reduces it in a ring, the result is copied back):
    ``2(m - 1)`` messages of ``nbytes / m`` each way (``message_cpu``, so in the lab the
    emulation's cost per byte too), ``(m - 1) / m`` of the bytes added, ``2 nbytes`` copied."""
    if members < 2 or nbytes <= 0:
        return 0.0
    steps = 2 * (members - 1)
    chunk = nbytes / members
    msgs = 2 * steps * message_cpu(chunk, costs, lab, per_message_shared_s)  # sent + received
    return (msgs + (members - 1) / members * nbytes / costs.reduce_bytes_per_s
            + 2 * nbytes / costs.copy_bytes_per_s)


def ps_cpu(nbytes: float, members: int, server: bool, costs: RuntimeCosts,
           lab: LabProfile | None = None, per_message_shared_s: float | None = None) -> float:
    """CPU seconds one replica spends in its stage's parameter-server sync
    (``topotrain.stagesync.ps_sum``): a worker sends and receives the whole flat gradient (two
    messages of ``nbytes``); the server receives and sends ``m - 1`` of them and adds ``m``
    buffers; both flatten and copy back ``2 nbytes`` (the server one copy more)."""
    if members < 2 or nbytes <= 0:
        return 0.0
    msg = message_cpu(nbytes, costs, lab, per_message_shared_s)
    if not server:
        return 2 * msg + 2 * nbytes / costs.copy_bytes_per_s
    return (2 * (members - 1) * msg + members * nbytes / costs.reduce_bytes_per_s
            + 3 * nbytes / costs.copy_bytes_per_s)
