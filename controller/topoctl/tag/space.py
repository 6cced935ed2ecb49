"""TAG's state/action space per op-group, restricted to the plans the runtime executes.

TAG (Zhang et al., "Expediting Distributed DNN Training with Device Topology-Aware Graph
Deployment", IEEE TPDS 2023) decides, for each op-group of the coarse graph in turn, the set of
machines it is replicated on and how its gradients are synchronised over that set. A *state* is
the tuple of decisions taken so far (one per op-group, groups in a topological order); a
*complete* state has one per group. Actions (hashable tuples):

- group 0 only: ``("dp", kind, sfb)``: every group data parallel over all hosts with the
  collective `kind` (``ring``, ``trees``, ``ring+shares``, ``trees+shares``: batch shares by
  speed; ``topoopt``: that strategy's whole plan, rings, routes and cabling); `sfb`: group
  0's fully connected layers synchronised by sufficient-factor broadcasting (only on kinds
  in `Space.sfb_kinds`, only for groups in `Space.sfb_groups`);
- group 0, or any later group of a staged state: ``("stage", hosts, sync)``: the group starts a
  new pipeline stage replicated on `hosts` (a tuple in host order, disjoint from the earlier
  stages' hosts), its replicas synchronised by `sync` (``none`` for one replica, ``ring``,
  ``trees``: packed spanning trees over the stage's own cables, when `Space.stage_syncs`
  offers them, or ``ps:<host>``: a parameter server on one of them), with the suffix
  ``+shares`` when its replicas split each micro-batch's rows by host speed (offered when
  `Space.speeds` differ within the set) rather than evenly (`split_sync`);
- later groups of a staged state: ``("same",)``: the group joins the current stage;
- later groups of a data-parallel state: ``("ar",)`` (its gradients all-reduced) or
  ``("sfb",)`` (its FC layers by SFB).

Replica counts: the runtime (`topotrain.pipeline`, `topocontract.stages`) runs stages of
unequal replica counts, each replica taking a share of every micro-batch's rows; with
``equal_replicas=False`` (the strategy's widened space) every size in `Space.sizes` is legal
at every stage, with ``equal_replicas=True`` (the space before the runtime ran them) every
later stage has as many hosts as the first. Hosts no stage uses stay idle (the renderer
launches only stage ranks).

Default completion (`complete`): every undecided group joins the current stage (``same``) or is
all-reduced (``ar``), so every node of the search tree is a runnable plan that can be simulated.

Complexity: `legal` enumerates O(C(u, g) * (g + 1)) actions (u unused hosts, g the replica
count; bounded by `MAX_SETS` host sets per size); `complete` and `plan_of` are O(groups).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

Action = tuple
State = tuple[Action, ...]

MAX_SETS = 128  # host sets per replica count offered at one level (beyond: windows, see below)
DP_KINDS = ("ring", "trees", "ring+shares", "trees+shares", "topoopt")


@dataclass(frozen=True)
class Space:
    """The search space of one job on one cluster (plain data).

    `hosts`: training hosts in rank order; `groups`: op-groups (levels); `sizes`: the replica
    counts a stage may have (the global batch must split into replicas x micro-batches);
    `dp_kinds`: data-parallel collectives offered; `sfb_groups`: groups with SFB-eligible layers;
    `sfb_kinds`: the data-parallel kinds SFB runs on; `ps_min`: the smallest replica set offered
    a parameter server (on two replicas it moves what the ring moves); `order`: hosts in the
    order host sets are windowed when there are too many subsets (e.g. fastest first)."""

    hosts: tuple[str, ...]
    groups: int
    sizes: tuple[int, ...]
    dp_kinds: tuple[str, ...] = DP_KINDS
    sfb_groups: frozenset[int] = frozenset()
    sfb_kinds: frozenset[str] = frozenset({"ring"})
    equal_replicas: bool = True  # the runtime's restriction (module docstring)
    ps_min: int = 3
    order: tuple[str, ...] = field(default=())
    stage_syncs: tuple[str, ...] = ("ring", "ps")  # + "trees" where stages may pack trees
    speeds: tuple[float, ...] = ()  # per host (hosts' order); differing: `+shares` offered


def host_sets(space: Space, free: Sequence[str], size: int) -> list[tuple[str, ...]]:
    """Replica sets of `size` hosts among `free` (in host order). All subsets when there are at
    most `MAX_SETS`; otherwise the windows of `size` consecutive hosts of `space.order` (and of
    host order), deduplicated: the space stays searchable at 16+ hosts."""
    if size > len(free):
        return []
    pos = {h: i for i, h in enumerate(space.hosts)}
    subsets = list(combinations(sorted(free, key=pos.__getitem__), size))
    if len(subsets) <= MAX_SETS:
        return subsets
    out: dict[tuple[str, ...], None] = {}
    for seq in (space.order or space.hosts, space.hosts):
        seq = [h for h in seq if h in free]
        for i in range(len(seq)):
            win = [seq[(i + k) % len(seq)] for k in range(size)]
            out[tuple(sorted(win, key=pos.__getitem__))] = None
    return list(out)


def syncs(space: Space, hosts: Sequence[str]) -> list[str]:
    """Sync kinds of a stage on `hosts`: none (one replica), else ring, trees (when offered)
    and a parameter server on each member (from `ps_min` replicas on); each also with
    ``+shares`` when the members' speeds differ."""
    if len(hosts) == 1:
        return ["none"]
    out = ["ring"] + (["trees"] if "trees" in space.stage_syncs else [])
    out += [f"ps:{h}" for h in hosts] if "ps" in space.stage_syncs and len(hosts) >= \
        space.ps_min else []
    if space.speeds:
        pos = {h: i for i, h in enumerate(space.hosts)}
        if len({space.speeds[pos[h]] for h in hosts}) > 1:
            out += [f"{y}+shares" for y in out]
    return out


def split_sync(sync: str) -> tuple[str, str | None, bool]:
    """(kind, parameter server or None, rows split by speed) of a stage action's `sync`."""
    shares = sync.endswith("+shares")
    sync = sync.removesuffix("+shares")
    kind, _, server = sync.partition(":")
    return kind, server or None, shares


def _stage_actions(space: Space, free: Sequence[str], sizes: Sequence[int]) -> list[Action]:
    out = []
    for g in sizes:
        for s in host_sets(space, free, g):
            out += [("stage", s, y) for y in syncs(space, s)]
    return out


def used_hosts(state: State) -> set[str]:
    """Hosts some stage of `state` runs on."""
    return {h for a in state if a[0] == "stage" for h in a[1]}


def legal(space: Space, state: State) -> list[Action]:
    """The actions of the next undecided group of `state` (empty when complete), in a fixed
    order (deterministic)."""
    i = len(state)
    if i >= space.groups:
        return []
    if i == 0:
        dp = []
        for k in space.dp_kinds:
            dp.append(("dp", k, False))
            if 0 in space.sfb_groups and k in space.sfb_kinds:
                dp.append(("dp", k, True))
        return dp + _stage_actions(space, space.hosts, space.sizes)
    if state[0][0] == "dp":
        kind = state[0][1]
        return [("ar",)] + ([("sfb",)] if i in space.sfb_groups and kind in space.sfb_kinds
                            else [])
    used = used_hosts(state)
    free = [h for h in space.hosts if h not in used]
    sizes = [len(state[0][1])] if space.equal_replicas else list(space.sizes)
    return [("same",)] + _stage_actions(space, free, sizes)


def complete(space: Space, state: State) -> State:
    """`state` with every undecided group given the default: join the current stage (staged
    states) or all-reduce (data-parallel states). The empty state completes to data parallelism
    with the first kind offered (the baseline)."""
    if not state:
        state = (("dp", space.dp_kinds[0], False),)
    fill = ("ar",) if state[0][0] == "dp" else ("same",)
    return tuple(state) + (fill,) * (space.groups - len(state))


@dataclass(frozen=True)
class Stage:
    """A pipeline stage of a plan: groups [first, last], its hosts and sync."""

    first: int
    last: int
    hosts: tuple[str, ...]
    sync: str


@dataclass(frozen=True)
class Plan:
    """The canonical plan of a complete state: data parallel (`kind`, SFB `sfb_groups`) or
    `stages`. Equal plans are equal states (the evaluator's cache key)."""

    form: str  # "dp" or "pp"
    kind: str = ""
    sfb: tuple[int, ...] = ()
    stages: tuple[Stage, ...] = ()


def plan_of(state: State) -> Plan:
    """The canonical plan of complete `state`. O(groups)."""
    if state[0][0] == "dp":
        sfb = tuple(i for i, a in enumerate(state) if (i == 0 and a[2]) or a == ("sfb",))
        return Plan("dp", state[0][1], sfb)
    stages: list[Stage] = []
    for i, a in enumerate(state):
        if a[0] == "stage":
            if stages:
                stages[-1] = Stage(stages[-1].first, i - 1, stages[-1].hosts, stages[-1].sync)
            stages.append(Stage(i, i, a[1], a[2]))
    last = stages[-1]
    stages[-1] = Stage(last.first, len(state) - 1, last.hosts, last.sync)
    return Plan("pp", stages=tuple(stages))


def describe(action: Action) -> str:
    """One action as text (`topoctl explain`, progress lines)."""
    if action[0] == "dp":
        return f"data parallel, {action[1]}" + (", SFB" if action[2] else "")
    if action[0] == "stage":
        kind, server, shares = split_sync(action[2])
        return (f"new stage on {','.join(action[1])}, sync {kind}"
                + (f":{server}" if server else "") + (", batch shares by speed" if shares
                                                      else ""))
    return {"same": "same stage", "ar": "all-reduce", "sfb": "SFB"}[action[0]]
