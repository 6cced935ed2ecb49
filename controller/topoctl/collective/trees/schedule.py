"""Turn a :class:`~topoctl.collective.trees.pack.TreePlan` into what others read: the runtime's
tree schedule (``topocontract.schedule``) and the ``topoctl trees --json`` document.
Pure functions; no I/O."""

from __future__ import annotations

from typing import Any

from topocontract.schedule import TreeSchedule
from topoctl.fabric.capgraph import CapGraph

from .pack import TreePlan, chunk_bytes

__all__ = ["plan_to_json", "plan_to_schedule"]


def plan_to_schedule(
    plan: TreePlan,
    chunk_bytes: int | None = None,
    nbytes: float | None = None,
    latency_s: float = 50e-6,
    bytes_per_unit: float | None = None,
    metadata: dict[str, Any] | None = None,
) -> TreeSchedule:
    """Schedule by rank. The chunk size is ``chunk_bytes`` if given, else the pipelining
    optimum for ``nbytes`` (needs ``bytes_per_unit``: bytes/s per capacity unit), else 256 KiB.
    """
    trees = []
    for t in plan.trees:
        entry: dict[str, Any] = {"root": t.root, "rate": t.rate, "parents": t.parents}
        if chunk_bytes is None and nbytes and bytes_per_unit:
            part = nbytes * t.rate / plan.rate
            entry["chunk_bytes"] = _chunk(part, t.rate * bytes_per_unit, t.height, latency_s)
        trees.append(entry)
    meta = {
        "planner": "topoctl trees",
        "rate": plan.rate,
        "lp_optimum": plan.lp_optimum,
        "upper_bound": plan.upper_bound,
        **(metadata or {}),
    }
    return TreeSchedule.model_validate(
        {
            "world_size": len(plan.trees[0].parents),
            "chunk_bytes": chunk_bytes or 262144,
            "trees": trees,
            "metadata": meta,
        }
    )


def _chunk(part: float, rate: float, height: int, latency: float) -> int:
    return chunk_bytes(part, rate, height, latency)


def plan_to_json(plan: TreePlan, g: CapGraph) -> list[dict[str, Any]]:
    """Trees with node labels: ``{"root", "edges": [[parent, child]...], "paths", "rate"}``;
    ``paths`` maps ``"u v"`` (an edge that is not a direct link) to its routed node path
    ``u -> v`` (the reverse direction is routed separately and listed under ``"v u"``)."""
    label = [str(g.nodes[w]) for w in g.workers]
    out = []
    for t in plan.trees:
        paths: dict[str, list[str]] = {}
        for (a, b), (pab, pba) in t.paths.items():
            paths[f"{label[a]} {label[b]}"] = [str(g.nodes[x]) for x in pab]
            paths[f"{label[b]} {label[a]}"] = [str(g.nodes[x]) for x in pba]
        out.append(
            {
                "root": label[t.root],
                "edges": [[label[p], label[c]] for p, c in t.edges],
                "paths": paths,
                "rate": t.rate,
                "height": t.height,
            }
        )
    return out
