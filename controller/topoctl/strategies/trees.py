"""Planner strategy ``trees``: data parallelism with packed spanning trees (INFOCOM'21).

Same iteration as ``baseline`` (``baseline.dp_tasks``), but every gradient bucket is
all-reduced with the tree schedule that :func:`topoctl.collective.trees.pack.plan_trees` packs on
the cluster's fabric (capacities in bytes/s), scored by the simulator through the collective
interface (:mod:`topoctl.collective.trees.simulate`). The plan's ``job.collective`` carries
the runtime schedule (``topoagent.collectives``): the launcher writes it to a file and points
``$TOPO_TREE_SCHEDULE`` at it. One rank per host (the trees are over hosts).
"""

from __future__ import annotations

from topoctl.collective.trees.bounds import best_bound, tree_bounds
from topoctl.collective.trees.pack import plan_trees
from topoctl.collective.trees.schedule import plan_to_schedule
from topoctl.collective.trees.simulate import tree_algorithm
from topoctl.fabric.capgraph import build_capgraph
from topoctl.limits import SafetyClock
from topoctl.sim.fabric import network_from_fabric
from topoctl.sim.routing import shortest_next_hops

from . import PlanContext, Strategy, StrategyError
from .baseline import dp_tasks

LATENCY_S = 100e-6  # per-hop software latency assumed for the chunk size


def plan(ctx: PlanContext) -> Strategy:
    """Pack trees on the fabric, bound them, schedule the gradient buckets over them.
    StrategyError for a job it cannot plan (one host, several ranks per host); FabricError
    when the fabric cannot carry it (disconnected, a training host without links)."""
    if ctx.world_size != len(ctx.hosts):
        raise StrategyError("one rank per host only (trees are over hosts)")
    if len(ctx.hosts) < 2:
        raise StrategyError("needs at least two training hosts (one host has nothing to "
                            "all-reduce over the fabric): use baseline")
    links = [(ln.a, ln.b, ln.capacity / 8.0) for ln in ctx.fabric.links]
    g = build_capgraph(links, list(ctx.hosts))
    clock = SafetyClock()  # deterministic limits inside; this only guards against the absurd
    tp = plan_trees(g, clock=clock)
    bounds = tree_bounds(g, lp_upper=tp.upper_bound, clock=clock)
    bname, bval = best_bound(bounds)
    grad = float(ctx.graph.param_bytes)
    sched = plan_to_schedule(
        tp, nbytes=grad, latency_s=LATENCY_S, bytes_per_unit=1.0,
        metadata={"hosts": list(ctx.hosts), "rate_bytes_per_s": tp.rate,
                  "optimum_bytes_per_s": bval, "bound": bname},
    )
    hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
    tasks, sizes = dp_tasks(ctx, list(ctx.hosts), tree_algorithm(sched))
    return Strategy(
        name="trees",
        fabric=ctx.fabric,
        hops=hops,
        network=network_from_fabric(ctx.fabric, hops),
        tasks=tasks,
        collective={"algorithm": "trees", "order": list(ctx.hosts), "schedule": sched.dump()},
        buckets=sizes,
        notes={"trees": len(tp.trees), "rate_bytes_per_s": tp.rate, "optimum_bytes_per_s": bval,
               "bound": bname, "achieved_over_optimal": tp.rate / bval} | clock.report(),
    )


PLANNER_STRATEGIES = {"trees": plan}
