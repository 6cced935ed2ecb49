"""Post-pass ``+sfb``: sufficient-factor broadcasting for the fully connected layers where it
pays, on a data-parallel ring plan.

The candidates are the job's `linear` ops (an M x N weight, K rows of input per replica at the
per-rank batch). Each is costed on the plan's own network and op costs:
- saved: the ring AllReduce time of its gradient bytes (the marginal seconds per byte of the
  plan's ring, simulated on its network);
- extra: rebuilding the summed weight gradient from all P replicas' factors (one product over
  P K rows) less the replica's own weight gradient, which autograd no longer computes. On lab
  hosts (ops timed on this CPU) both are the layer's timed parameter backward, at the global
  batch and at the per-rank batch (one large product runs faster per row than P small ones);
  elsewhere (P - 1) times its forward time (the same FLOPs as one replica's product);
- gather: the all-gather of its input x (K x M) and of its output gradient d (K x N), each the
  simulated ring all-gather of P pieces (seconds per byte and per call).
`topoctl.sfb.program.choose_layers` picks the layers (TAG's 0/1 program, HiGHS). The
simulator's iteration then all-reduces only the other layers' gradients (DDP buckets rebuilt
without the chosen layers), and after the backward pass and the AllReduce (where the runtime
runs them: `topotrain.sfb`) all-gathers the chosen layers' factors and adds each host's extra
compute before its optimiser step. A rank leaves a ring all-gather when its own pieces are
through (``member_done``), not when the slowest rank's are, and rebuilds that layer's
gradient then, as the runtime does after each layer's gather: its rebuilds, its step and its
next forward and backward run while the ranks behind the slow cables still receive, and the
prediction is the steady period (`sim.steady`). All ranks' rebuilds after the slowest rank's
last gather put that compute on the critical path: +7.9% on the demo's row (K = 48 on
hetero8), +13% at K = 8 (docs/results.md). The plan's ``job.sfb`` names the chosen modules (the
renderer moves them there from ``collective.sfb``); ``metadata.collective.sfb`` the layers, the
objective and the bytes.

Hosts of several ranks: the AllReduce is the plan's hierarchical one and the factors are
gathered hierarchically (`strategies.devices.gather_algorithm`: one copy of each rank's
factors crosses the NICs per shard, then the host's ranks share them over the intra-host
link). Declared as the post-pass ``sfb`` (`strategies.post_pass`): ``baseline+sfb`` (alias
``sfb``), right after the base. Ranks with unequal batches (``+shares``) and
collectives other than the ring are refused. O(candidates) simulations of one collective, one
0/1 program, one simulation of the result.
"""

from __future__ import annotations

import math
from dataclasses import replace

from topoctl.graph.ops import Op, OpGraph
from topoctl.sfb.program import SfbChoice, SfbLayer, choose_layers
from topoctl.sim.engine import simulate
from topoctl.sim.network import Network
from topoctl.sim.schedules import ring_allgather, ring_allreduce
from topoctl.sim.tasks import Collective, Compute, Task, member_done

from . import PlanContext, Strategy, StrategyError, post_pass
from . import baseline as _baseline
from .devices import gather_algorithm, host_members

PROBE_BYTES = (1 << 20, 2 << 20)  # two collective sizes: a linear fit (per call, per byte)


def linear_layers(graph: OpGraph) -> list[tuple[Op, str, int, int, int]]:
    """The graph's fully connected layers with their weight: (op, module name, K rows per
    replica, M inputs, N outputs)."""
    out = []
    for op in graph.ops:
        weight = [(p, b) for p, b in op.params if p.endswith(".weight")]
        if op.kind != "linear" or len(weight) != 1 or not op.out_shape:
            continue
        (name, wbytes), n = weight[0], op.out_shape[-1]
        m = wbytes // graph.dtype_bytes // n
        k = math.prod(op.out_shape[:-1])
        out.append((op, name[: -len(".weight")], k, m, n))
    return out


def _fit(times: list[float]) -> tuple[float, float]:
    """(seconds per call, seconds per byte) through the two probe sizes' times."""
    (s1, s2), (t1, t2) = PROBE_BYTES, times
    per_byte = (t2 - t1) / (s2 - s1)
    return max(0.0, t1 - per_byte * s1), per_byte


def ring_rates(order: list[str], network: Network, allreduce=ring_allreduce,
               allgather=ring_allgather) -> tuple[tuple[float, float], tuple[float, float]]:
    """The ring's (per call, per byte) for an AllReduce of S bytes and for an all-gather of a
    piece of S bytes from every member, simulated alone on `network` (`allreduce` and
    `allgather`: the plan's own algorithms over the members `order`, e.g. hierarchical on
    hosts of several ranks: `strategies.devices`)."""
    p = len(order)

    def alone(schedule) -> float:
        return simulate([Collective("probe", schedule)], network, record=False).iteration_time

    ar = _fit([alone(allreduce(order, s)) for s in PROBE_BYTES])
    ag = _fit([alone(allgather(order, p * s)) for s in PROBE_BYTES])
    return ar, ag


def plan_rates(ctx: PlanContext, network: Network) -> tuple[tuple[float, float],
                                                            tuple[float, float]]:
    """`ring_rates` of the plan's own collectives over the training hosts (hierarchical on
    hosts of several ranks)."""
    ar, members, _ = _baseline.ring_collective(ctx, ctx.hosts)
    ag, _ = gather_algorithm(ctx, ctx.hosts)
    return ring_rates(members, network, ar, ag)


def extra_seconds(ctx: PlanContext, ops: list[str]) -> dict[tuple[str, str], float]:
    """(op, host) -> seconds a replica adds to rebuild the op's weight gradient from every
    replica's factors (see the module's docstring)."""
    p = ctx.world_size
    timed = ctx.train_costs is not None and ctx.cpu_pool is not None  # `planner._on_lab_cpu`
    at_k = ctx.train_costs(ctx.local_batch) if timed else None
    at_all = ctx.train_costs(ctx.local_batch * p) if at_k else None
    out = {}
    for op in ops:
        for h in ctx.hosts:
            if at_k and at_all:
                grow = at_all[op].bwd_params - at_k[op].bwd_params
                out[(op, h)] = ctx.job.cost.scale * max(0.0, grow)
            else:
                out[(op, h)] = (p - 1) * ctx.host_costs(h)[op].fwd
    return out


def _program(ctx: PlanContext, network: Network
             ) -> tuple[SfbChoice, dict[str, tuple], dict[str, tuple[float, float]]]:
    """The candidates, their costs on the plan's network and op costs, and the program's
    choice; also op name -> (module, K, M, N, factor bytes per replica), and op name ->
    (seconds of AllReduce SFB saves, seconds it costs alone: its gathers and rebuild)."""
    (_, ar_b), (ag_c, ag_b) = plan_rates(ctx, network)
    width = ctx.graph.dtype_bytes
    cands, gather, info = [], {}, {}
    layers = linear_layers(ctx.graph)
    extra = extra_seconds(ctx, [op.name for op, *_ in layers])
    for op, module, k, m, n in layers:
        more = max(extra[(op.name, h)] for h in ctx.hosts)
        x, d = f"x:{op.name}", f"d:{op.name}"
        gather[x] = ag_c + ag_b * k * m * width
        gather[d] = ag_c + ag_b * k * n * width
        cands.append(SfbLayer(op.name, (x, d), more, ar_b * op.param_bytes))
        info[op.name] = (module, k, m, n, k * (m + n) * width)
    alone = {c.name: (c.saved_s, c.extra_s + sum(gather[e] for e in c.factors)) for c in cands}
    return choose_layers(cands, gather), info, alone


def closest_left_out(chosen: list[str], info: dict[str, tuple],
                     alone: dict[str, tuple[float, float]]) -> dict | None:
    """The candidate left to the AllReduce that came nearest to paying for SFB on its own
    (largest saving minus cost), for `explain` to say why it was not chosen; None when every
    candidate was chosen. O(candidates)."""
    left = [op for op in info if op not in chosen]
    if not left:
        return None
    op = max(left, key=lambda o: (alone[o][0] - alone[o][1], o))
    return {"module": info[op][0], "op": op, "saved_s": alone[op][0], "cost_s": alone[op][1]}


def _without(graph: OpGraph, ops: set[str]) -> OpGraph:
    """`graph` with no gradients for `ops` (they leave the AllReduce's buckets)."""
    return replace(graph, ops=[replace(o, params=(), param_bytes=0) if o.name in ops else o
                               for o in graph.ops])


def sfb_tasks(ctx: PlanContext, chosen: list[str], factor_bytes: dict[str, float]
              ) -> tuple[list[Task], list[int]]:
    """One iteration: `baseline.dp_tasks` without the chosen layers' gradients, then (after
    the backward pass and the last AllReduce, as the runtime's `SfbLayers.sync` does) per
    layer one ring all-gather of its factors and each host's rebuild of its gradient
    (``rebuild<i>@<host>``), then each host's optimiser step (the whole model's).

    A rank leaves a gather when its own part is done (``member_done``: gloo's ranks leave a
    ring all-gather one by one) and rebuilds that layer's gradient then, while the ranks
    behind the slow cables still receive; the next layer's gather starts when every rank has
    rebuilt (it needs every rank in it). The last layer's rebuild and the step of a rank
    that leaves early run under the gathers' tail, and so does its next forward and
    backward: the planner predicts the steady period (`sim.steady`)."""
    p = ctx.world_size
    algorithm, members, _ = _baseline.ring_collective(ctx, ctx.hosts)
    gather, gmembers = gather_algorithm(ctx, ctx.hosts)
    tasks, sizes = _baseline.dp_tasks(replace(ctx, graph=_without(ctx.graph, set(chosen))),
                                      members, algorithm)
    if not chosen:
        return tasks, sizes
    steps = {t.id: t for t in tasks if t.id.startswith("step@")}
    body = [t for t in tasks if t.id not in steps]
    after = tuple(d for t in steps.values() for d in t.deps)  # backward tails, last AllReduce
    prev = tuple(dict.fromkeys(after))
    extra = extra_seconds(ctx, chosen)
    for i, op in enumerate(chosen):
        # x and d of one layer: one gather task of both (the runtime gathers them as one
        # tensor), in the process group of DDP's AllReduces (gloo's default one)
        cid = f"sfb{i}"
        body.append(Collective(cid, gather(gmembers, p * factor_bytes[op]), prev,
                               member_done=True, group=_baseline.GLOO_GROUP))
        body += [Compute(f"rebuild{i}@{h}", h, extra[(op, h)],
                         tuple(member_done(cid, d) for d in host_members(ctx, h)))
                 for h in ctx.hosts]
        prev = tuple(f"rebuild{i}@{h}" for h in ctx.hosts)
    last = len(chosen) - 1
    body += [Compute(f"step@{h}", h, _baseline.step_time(ctx, h), (f"rebuild{last}@{h}",))
             for h in ctx.hosts]
    return body, sizes


@post_pass("sfb", applies_to=("baseline",))
def with_sfb(ctx: PlanContext, base: Strategy, layers: list[str] | None = None) -> Strategy:
    """`base` (a data-parallel ring plan) with the layers the 0/1 program picks synchronised by
    SFB: its tasks rebuilt, the modules in its collective, the choice in its notes. `layers`
    (op names) overrides the program's choice (benchmarks measure a forced choice with it);
    StrategyError names one that is not a candidate."""
    if base.collective.get("algorithm") != "ring" or "shares" in base.collective:
        raise StrategyError("SFB is planned on data-parallel ring plans with even batches "
                            f"(not {base.name})")
    choice, info, alone = _program(ctx, base.network)
    chosen = list(choice.layers) if layers is None else list(layers)
    unknown = [op for op in chosen if op not in info]
    if unknown:
        raise StrategyError(f"not a fully connected layer with a weight: {', '.join(unknown)}")
    tasks, sizes = sfb_tasks(ctx, chosen, {op: info[op][4] for op in info})
    modules = [info[op][0] for op in chosen]
    notes = dict(base.notes) | {"sfb": {
        "layers": {info[op][0]: {"op": op, "k": info[op][1], "m": info[op][2],
                                 "n": info[op][3]} for op in chosen},
        "candidates": len(info), "objective_s": choice.objective,
        **({"forced": True} if layers is not None else {}),
        "gathered_bytes_per_replica": sum(info[op][4] for op in chosen)}}
    near = closest_left_out(chosen, info, alone)
    if near is not None:  # why the others stay with the AllReduce (`topoctl explain`)
        notes["sfb"]["closest"] = near
    return replace(base, name=f"{base.name}+sfb", tasks=tasks, buckets=sizes,
                   collective=base.collective | {"sfb": modules}, notes=notes)
