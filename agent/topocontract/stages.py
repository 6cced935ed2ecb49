"""How the replicas of a pipeline stage synchronise their gradients: the per-stage `sync` of a
pipeline plan's `job.collective.stages[i]`, written by the planner
(`topoctl.strategies.placement`) and executed by the runtime (`topotrain.stagesync`)::

    stages:
      - hosts: [h0, h1, h2]
        ranks: [0, 1, 2]
        sync: {kind: ps, server: h0}   # or {kind: ring}, or {kind: none} (one replica)

Kinds:

- ``none``: the stage has one replica; nothing to synchronise.
- ``ring``: one gloo all_reduce over the stage's group (gloo's ring over the group's ranks in
  the stage's host order).
- ``ps``: a parameter server on ``server`` (one of the stage's hosts): every other replica
  sends its flattened gradient to it (gloo send/recv), the server sums them in rank order and
  sends the sum back to each.
- ``trees``: packed spanning trees over the stage's group (``schedule``: a tree schedule,
  `topocontract.schedule`, whose rank i is the stage's i-th replica; the stage's ranks
  ascending, so that it is also the rank in the stage's process group), run by the tree
  runtime (`topotrain.collectives.tree_allreduce`) on the stage's group.

A stage without ``sync`` (plans written before it existed) means ``ring`` with several
replicas and ``none`` with one. Import-light: no torch, nothing of the controller or the
runtime.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from topocontract.schedule import TreeSchedule

__all__ = ["SYNC_KEYS", "SYNC_KINDS", "sync_of", "sync_problems", "tree_schedule"]

SYNC_KINDS = ("none", "ring", "ps", "trees")
SYNC_KEYS = {"none": {"kind"}, "ring": {"kind"}, "ps": {"kind", "server"},
             "trees": {"kind", "schedule"}}


def sync_of(stage: dict) -> tuple[str, int | None]:
    """(kind, index of the server within the stage's hosts or None) of a stage that
    `sync_problems` accepted; the default for a stage without `sync` (module docstring)."""
    sync = stage.get("sync")
    if sync is None:
        return ("ring" if len(stage.get("ranks", [])) > 1 else "none"), None
    if sync["kind"] == "ps":
        return "ps", list(stage["hosts"]).index(sync["server"])
    return sync["kind"], None


def _stage_problems(stage: Any, at: str) -> list[tuple[str, str]]:
    if not isinstance(stage, dict):
        return [(at, "expected a mapping (a stage)")]
    hosts, ranks = stage.get("hosts"), stage.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return [(f"{at}.ranks", "expected a non-empty list of ranks")]
    if not isinstance(hosts, list) or len(hosts) != len(ranks):
        return [(f"{at}.hosts", "expected a list of hosts, one per rank")]
    sync = stage.get("sync")
    if sync is None:
        return []
    if not isinstance(sync, dict):
        return [(f"{at}.sync", f"expected a mapping {{kind: {' | '.join(SYNC_KINDS)}}}")]
    kind = sync.get("kind")
    if kind not in SYNC_KINDS:
        return [(f"{at}.sync.kind", f"unknown sync kind {kind!r}; expected one of "
                                    f"{', '.join(SYNC_KINDS)}")]
    out = [(f"{at}.sync.{k}", f"unknown key for sync kind {kind}")
           for k in sorted(set(sync) - SYNC_KEYS[kind], key=str)]
    if kind == "none" and len(ranks) > 1:
        out.append((f"{at}.sync.kind", f"none: the stage has {len(ranks)} replicas to "
                                       "synchronise (ring or ps)"))
    if kind != "none" and len(ranks) < 2:
        out.append((f"{at}.sync.kind", f"{kind}: the stage has one replica (none)"))
    if kind == "ps" and sync.get("server") not in hosts:
        out.append((f"{at}.sync.server", f"{sync.get('server')!r} is not one of the stage's "
                                         f"hosts ({', '.join(map(str, hosts))})"))
    if kind == "trees":
        out += _trees_problems(sync.get("schedule"), ranks, f"{at}.sync.schedule")
    return out


def _trees_problems(schedule: Any, ranks: list, at: str) -> list[tuple[str, str]]:
    """A stage's tree schedule: valid, one rank per replica, the stage's ranks ascending."""
    try:
        sched = TreeSchedule.model_validate(schedule)
    except ValidationError as e:
        return [(".".join([at] + [str(x) for x in err["loc"]]),
                 err["msg"].removeprefix("Value error, ")) for err in e.errors()]
    out = []
    if sched.world_size != len(ranks):
        out.append((f"{at}.world_size", f"{sched.world_size}: the stage has {len(ranks)} "
                                        "replicas"))
    if not all(isinstance(r, int) for r in ranks) or ranks != sorted(ranks):
        out.append((at.removesuffix(".sync.schedule") + ".ranks",
                    "trees: the stage's ranks must ascend (schedule rank = group rank)"))
    return out


def tree_schedule(stage: dict) -> TreeSchedule:
    """The validated tree schedule of a `trees` stage."""
    return TreeSchedule.model_validate(stage["sync"]["schedule"])


def sync_problems(collective: Any, prefix: str = "job.collective") -> list[tuple[str, str]]:
    """Every problem (YAML path under `prefix`, message) of a pipeline collective's stages and
    their `sync`; empty when valid, and for collectives that are not pipelines."""
    if not isinstance(collective, dict) or collective.get("algorithm") != "pipeline":
        return []
    stages = collective.get("stages")
    if not isinstance(stages, list) or not stages:
        return [(f"{prefix}.stages", "expected a non-empty list of stages")]
    out = []
    for i, st in enumerate(stages):
        out += _stage_problems(st, f"{prefix}.stages[{i}]")
    return out
