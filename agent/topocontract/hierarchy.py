"""The hierarchical AllReduce's contract: the plan's ``job.collective`` for hosts that run
several ranks, written by the planner and executed by the runtime
(`topotrain.collectives.hierarchy`)::

    collective:
      algorithm: ring            # or trees: the inter-host part (then `schedule`, over hosts)
      order: [h0, h1, h2, h3]    # the hosts' ring order (trees: schedule rank j is order[j])
      hierarchical: {local_size: 2}

Every host in ``order`` runs ``local_size`` ranks (local ranks 0..k-1, from the launch spec's
``processes``). An AllReduce of S bytes is the one NCCL and Blink run on multi-GPU hosts:

1. reduce-scatter among the host's k ranks (each ends with the host's sum of shard i, S/k);
2. shard i all-reduced among the ranks of local rank i on every host: a ring in host
   ``order`` or the plan's trees over hosts;
3. all-gather among the host's k ranks.

A host's NICs carry S in total in step 2, as in a flat ring over hosts; each slow link is
crossed once per shard, and the intra-host steps stay on the fast link.

Import-light: no torch, nothing of the controller or the runtime. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topoagent.protocol import TopoError
from topocontract.schedule import TreeSchedule

__all__ = ["HIERARCHY_KEY", "Hierarchy", "HierarchyError", "parse_hierarchy",
           "relabel_schedule", "ring_is_sorted"]

HIERARCHY_KEY = "hierarchical"
INTER_ALGORITHMS = ("ring", "trees")


class HierarchyError(TopoError, ValueError):
    """`job.collective.hierarchical` does not fit the job's processes."""


@dataclass(frozen=True)
class Hierarchy:
    """The ranks of a hierarchical AllReduce: `hosts` in ring order, per host its global
    ranks by local rank (`ranks[j][i]`: host `hosts[j]`, local rank i), the inter-host
    algorithm (`ring` | `trees`)."""

    local_size: int
    inter: str
    hosts: tuple[str, ...]
    ranks: tuple[tuple[int, ...], ...]

    @property
    def world_size(self) -> int:
        """Ranks in the job."""
        return self.local_size * len(self.hosts)

    def host_ranks(self, j: int) -> tuple[int, ...]:
        """Global ranks of host `hosts[j]`, by local rank (its intra-host group)."""
        return self.ranks[j]

    def shard_ranks(self, i: int) -> tuple[int, ...]:
        """Global ranks of local rank `i` on every host, in host order (shard i's group)."""
        return tuple(r[i] for r in self.ranks)

    def locate(self, rank: int) -> tuple[int, int]:
        """(host index in `hosts`, local rank) of global `rank`; KeyError when not a rank."""
        for j, rs in enumerate(self.ranks):
            if rank in rs:
                return j, rs.index(rank)
        raise KeyError(rank)


def _pairs(procs: Sequence) -> list[tuple[int, int]]:
    """(rank, local_rank) of a host's processes: `Process` models or plain mappings."""
    out = []
    for p in procs:
        if isinstance(p, Mapping):
            out.append((int(p["rank"]), int(p["local_rank"])))
        else:
            out.append((int(p.rank), int(p.local_rank)))
    return out


def _local_size(spec: object, where: str) -> int:
    """`hierarchical.local_size` checked: an integer >= 1."""
    k = spec.get("local_size") if isinstance(spec, Mapping) else None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise HierarchyError([(f"{where}.{HIERARCHY_KEY}.local_size",
                               f"must be an integer >= 1 (the ranks per host), got {k!r}")])
    return k


def parse_hierarchy(collective: Mapping, processes: Mapping[str, Sequence],
                    where: str = "job.collective") -> Hierarchy | None:
    """The hierarchy `collective` asks for over the job's `processes` (host -> its processes,
    each with `rank` and `local_rank`), or None when it has no `hierarchical` key.
    HierarchyError naming the YAML path when the plan and the processes disagree: an unknown
    inter-host algorithm, `order` not naming exactly the hosts, a host not running exactly
    `local_size` ranks with local ranks 0..k-1, or ranks not 0..world-1 once each. O(ranks)."""
    spec = collective.get(HIERARCHY_KEY)
    if spec is None:
        return None
    k = _local_size(spec, where)
    inter = collective.get("algorithm", "ring")
    if inter not in INTER_ALGORITHMS:
        raise HierarchyError([(f"{where}.algorithm", f"{inter!r} cannot be the inter-host "
                               f"part of a hierarchical AllReduce (one of "
                               f"{', '.join(INTER_ALGORITHMS)})")])
    order = list(collective.get("order") or sorted(processes))
    if sorted(order) != sorted(processes) or len(set(order)) != len(order):
        raise HierarchyError([(f"{where}.order", f"must name every host that runs ranks once "
                               f"({', '.join(sorted(processes))}), got {order}")])
    ranks = []
    for h in order:
        pairs = sorted(_pairs(processes[h]), key=lambda p: p[1])
        # lengths first: `local_size` is the plan's word (maybe 2**70), never a range of it
        if len(pairs) != k or any(lr != i for i, (_, lr) in enumerate(pairs)):
            raise HierarchyError([(f"job.processes.{h}", f"{h} runs local ranks "
                                   f"{[lr for _, lr in pairs]}; {where}.{HIERARCHY_KEY}."
                                   f"local_size {k} needs exactly 0..{k - 1}")])
        ranks.append(tuple(r for r, _ in pairs))
    flat = sorted(r for rs in ranks for r in rs)
    if flat != list(range(len(flat))):
        raise HierarchyError([("job.processes", f"ranks must be 0..{len(flat) - 1} once "
                               f"each, got {flat}")])
    return Hierarchy(k, inter, tuple(order), tuple(ranks))


def ring_is_sorted(order: Sequence[int]) -> bool:
    """Whether the ring visiting `order` (distinct integers) is the ring of the same integers
    in ascending order, up to where it starts and its direction: the same cables either way.
    (A process group's own ring runs in ascending rank order.) O(n)."""
    n = len(order)
    if n <= 3:
        return True  # every cyclic order of at most 3 is the same ring
    s = sorted(order)
    nxt = {s[i]: s[(i + 1) % n] for i in range(n)}
    fwd = all(nxt[order[i]] == order[(i + 1) % n] for i in range(n))
    bwd = all(nxt[order[(i + 1) % n]] == order[i] for i in range(n))
    return fwd or bwd


def relabel_schedule(schedule: TreeSchedule, new_rank: Sequence[int]) -> TreeSchedule:
    """`schedule` with rank j renamed `new_rank[j]` (a permutation of 0..n-1): a schedule over
    hosts in plan `order` becomes one over a process group's ranks. O(trees * n)."""
    n = schedule.world_size
    if sorted(new_rank) != list(range(n)):
        raise HierarchyError([("job.collective.schedule", f"cannot relabel a schedule of "
                               f"{n} ranks with {list(new_rank)}")])
    doc = schedule.model_dump()
    for t in doc["trees"]:
        parents = [None] * n
        for j, p in enumerate(t["parents"]):
            parents[new_rank[j]] = None if p is None else new_rank[p]
        t["parents"] = parents
        t["root"] = new_rank[t["root"]]
    return TreeSchedule.model_validate(doc)
