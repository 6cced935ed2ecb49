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
replicas and ``none`` with one.

Replica counts may differ between stages (stage 0 on two hosts, stage 1 on one, say). Every
stage then processes the same micro-batches: micro-batch m is rows ``[m T, (m + 1) T)`` of the
iteration's global batch (T rows, ``microbatches`` x T = the global batch), and a stage's
replicas split each micro-batch into contiguous row ranges, in rank-list order::

    microbatches: 2
    micro_batch: 4            # rows of a replica of a stage without `shares`
    stages:
      - hosts: [h0, h1]
        ranks: [0, 1]
        sync: {kind: ring}   # no shares: 4 rows each, T = 8
      - hosts: [h2]
        ranks: [2]
        shares: [8]          # rows of each micro-batch per replica (one per rank)
        sync: {kind: none}

``shares`` (optional, positive integers, one per rank) says how many rows of each micro-batch
each replica takes; without it every replica takes ``micro_batch`` rows (a plan that states
shares on every stage sets ``micro_batch`` to stage 0's first share, so that a stage's
``send_bytes``, the bytes ``micro_batch`` rows send, keeps its meaning; ``replicas`` is then
the most replicas of any stage). The planner writes such plans with
`topoctl.strategies.placement.search_shape`. Every stage's shares
sum to the same T. Between consecutive stages the activations are split and gathered by rows
(`pieces`): replica j of stage s sends replica i of stage s + 1 the rows their ranges share,
and the gradients come back the same way; stages whose replicas and shares match pair replica
r with replica r (the equal-count plans of before). A replica weighs its loss by its share of
the batch (rows / (T x microbatches)), so the stage's summed gradient is that of the whole
batch. Tensors crossing a boundary whose ranges differ must be batch-major (dim 0 grows with
the rows).

Import-light: no torch, nothing of the controller or the runtime.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from topocontract.schedule import TreeSchedule

__all__ = ["SYNC_KEYS", "SYNC_KINDS", "pieces", "stage_shares", "sync_of", "sync_problems",
           "tree_schedule"]

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
    out = _shares_problems(stage.get("shares"), ranks, at)
    sync = stage.get("sync")
    if sync is None:
        return out
    if not isinstance(sync, dict):
        return [(f"{at}.sync", f"expected a mapping {{kind: {' | '.join(SYNC_KINDS)}}}")]
    kind = sync.get("kind")
    if kind not in SYNC_KINDS:
        return [(f"{at}.sync.kind", f"unknown sync kind {kind!r}; expected one of "
                                    f"{', '.join(SYNC_KINDS)}")]
    out += [(f"{at}.sync.{k}", f"unknown key for sync kind {kind}")
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


def _shares_problems(shares: Any, ranks: list, at: str) -> list[tuple[str, str]]:
    if shares is None:
        return []
    if (not isinstance(shares, list) or len(shares) != len(ranks)
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                       for x in shares)):
        return [(f"{at}.shares", f"expected {len(ranks)} positive integers (rows of each "
                                 "micro-batch per replica, one per rank)")]
    return []


def stage_shares(collective: dict) -> list[list[int]]:
    """Rows of each micro-batch per replica, per stage (module docstring): the stage's
    `shares`, else `micro_batch` for each of its ranks."""
    micro = collective.get("micro_batch")
    return [list(st["shares"]) if st.get("shares") is not None
            else [micro] * len(st["ranks"]) for st in collective["stages"]]


def pieces(sender: list[int], receiver: list[int]) -> list[tuple[int, int, int, int]]:
    """The rows of a micro-batch that cross a boundary, as (sending replica j, receiving
    replica i, first row, end row) within the micro-batch: the overlaps of the two stages'
    contiguous row ranges (`sender`, `receiver`: their shares, equal sums), in (j, i) order,
    which is also the order of the rows. O(len(sender) + len(receiver))."""
    out = []
    j = i = lo = 0
    a_end, b_end = sender[0], receiver[0]
    while j < len(sender) and i < len(receiver):
        hi = min(a_end, b_end)
        if hi > lo:
            out.append((j, i, lo, hi))
        lo = hi
        if a_end == hi:
            j += 1
            a_end += sender[j] if j < len(sender) else 0
        if b_end == hi:
            i += 1
            b_end += receiver[i] if i < len(receiver) else 0
    return out


def _batch_problems(collective: dict, prefix: str) -> list[tuple[str, str]]:
    """`micro_batch` where a stage needs it; every stage's shares sum to the same rows."""
    stages = collective["stages"]
    if all(st.get("shares") is None for st in stages):  # equal counts: as before shares
        return []
    micro = collective.get("micro_batch")
    if any(st.get("shares") is None for st in stages) and (
            not isinstance(micro, int) or isinstance(micro, bool) or micro < 1):
        return [(f"{prefix}.micro_batch", "expected a positive integer (rows of a replica of "
                                          "a stage without shares)")]
    totals = [sum(x) for x in stage_shares(collective)]
    return [(f"{prefix}.stages[{i}].shares", f"the stage's replicas take {t} rows of each "
                                             f"micro-batch, stage 0's take {totals[0]}")
            for i, t in enumerate(totals) if t != totals[0]]


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
    """Every problem (YAML path under `prefix`, message) of a pipeline collective's stages,
    their `sync` and `shares`; empty when valid, and for collectives that are not pipelines."""
    if not isinstance(collective, dict) or collective.get("algorithm") != "pipeline":
        return []
    stages = collective.get("stages")
    if not isinstance(stages, list) or not stages:
        return [(f"{prefix}.stages", "expected a non-empty list of stages")]
    out = []
    for i, st in enumerate(stages):
        out += _stage_problems(st, f"{prefix}.stages[{i}]")
    return out or _batch_problems(collective, prefix)
