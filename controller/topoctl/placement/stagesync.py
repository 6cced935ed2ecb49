"""Gradient sync of a pipeline stage's replicas, for the simulator: the parameter server's
schedule, its CPU cost on the runtime's ranks, and the choice per stage between gloo's ring
and a parameter server on each of the stage's hosts (`topocontract.stages` says what the plan
states, `topotrain.stagesync` runs it). Pure functions over plain data; no I/O.

Parameter server (Li et al., OSDI'14; one shard on one of the replicas' hosts): every worker
sends its whole gradient of S bytes to the server, the server sends the sum back to each once
all arrived. Through the server's links: 2(m - 1) S bytes, two message rounds; gloo's ring
(`sim.schedules.ring_allreduce`, the bandwidth-optimal 2(m - 1)/m S per rank) takes 2(m - 1)
rounds over the group's order. Which is faster depends on the fabric: the server wins where
its links are fat and the ring's paths thin or shared (a star whose leaves are joined by slow
cables), or where round latency dominates a small gradient; the ring wins on a ring or any
fabric where each member's path to its ring neighbour is as fast as its path to a server.

Packed spanning trees (Wang et al., INFOCOM'21; `collective.trees`) over the stage's group
(`stage_trees`: packed on the cables between the stage's hosts, the chunk size the whole-
cluster trees pick for the stage's gradient, `collective.trees.pipeline.choose_chunks`): the
network part is its AllReduce (`collective.trees.simulate.tree_allreduce_schedule`, pipelined
in at most 16 chunks per tree), the CPU part each member's own (`tree_cpu`: the tree runtime's
per-rank model, `collective.trees.pipeline.rank_cpu`: messages, pieces, bytes added, copied
and on the wire, in the lab the cable emulation too). The lock-step runtime posts its receives
ahead, so a member's CPU runs while the chunks travel (the whole-cluster model's
max(network, CPU)): its CPU task starts with the collective, and its step waits for both. On
the network alone packed trees win nearly everywhere (they use the direction gloo's ring
leaves idle), so without a CPU model for the tree runtime (`tree_cpu` None) they are not
offered; gloo's ring and the server are modelled with their own CPU where the caller has it.

`choose_sync` decides by simulation, on the plan's own network (routes, link rates and
latencies; in the lab the shared cores): each option of a stage as a `Collective` after which
each member pays its CPU for it, the fastest kept; ties go to the ring, then to the earlier
host. Deterministic. O((m + 1) * simulation of one collective) per stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from topocontract.schedule import TreeSchedule
from topocontract.trees import chunk_count
from topoctl.collective.trees.pack import TreePlan, plan_trees
from topoctl.collective.trees.pipeline import RuntimeCosts, choose_chunks, rank_cpu, tree_shape
from topoctl.collective.trees.schedule import plan_to_schedule
from topoctl.collective.trees.simulate import tree_allreduce_schedule
from topoctl.fabric.capgraph import FabricError, build_capgraph
from topoctl.labprofile import LabProfile
from topoctl.sim.engine import simulate
from topoctl.sim.network import Network
from topoctl.sim.schedules import Schedule, Step, ring_allreduce
from topoctl.sim.tasks import Collective, Compute, Task

__all__ = ["choose_sync", "ps_allreduce", "stage_trees", "sync_schedule", "sync_tasks",
           "tree_cpu"]

TREE_MAX_CHUNKS = 16  # chunks per tree the simulator models at most (planning speed)
# (sync kind, bytes, members, is the server) -> CPU seconds of one member; None: not modelled
CpuCost = Callable[[str, float, int, bool], float]
# (tree schedule, bytes) -> CPU seconds of each member (stage order) in a `trees` sync
TreeCpu = Callable[[TreeSchedule, float], Sequence[float]]


def stage_trees(links: Sequence[tuple[str, str, float]], members: Sequence[str], size: float,
                costs: RuntimeCosts, lab: LabProfile | None = None,
                efficiency: float = 1.0) -> TreeSchedule | None:
    """Packed spanning trees over `members` on the cables between them (`links`: (a, b,
    bytes/s) of the whole fabric; cables to other hosts are left out: the stage's trees run in
    its own process group), chunked as `choose_chunks` picks for `size` bytes (`lab`: every
    member on that lab machine; `efficiency`: goodput per line byte). None for one member,
    no gradient, or members not joined by their own cables. Rank i = members[i]."""
    if len(members) < 2 or size <= 0:
        return None
    inside = set(members)
    tp = _packed(tuple((a, b, c) for a, b, c in links if a in inside and b in inside and a != b),
                 tuple(members))
    if tp is None:
        return None
    shape = tree_shape([t.parents for t in tp.trees], [t.rate for t in tp.trees])
    best = choose_chunks(shape, size, tp.rate * efficiency, costs,
                         len(members) if lab is not None else 1,
                         **({"lab": lab} if lab is not None else {}))
    return plan_to_schedule(tp, chunk_bytes=max(1, best.chunk_bytes))


@lru_cache(maxsize=256)
def _packed(own: tuple[tuple[str, str, float], ...], members: tuple[str, ...]) -> TreePlan | None:
    """The packed trees over `members` on the cables `own` (None when they are not joined or
    no tree packs); cached: a search values many stages on the same hosts (strategy `tag`)."""
    try:
        tp = plan_trees(build_capgraph(list(own), list(members)))
    except FabricError:  # members not joined by their own cables: no trees
        return None
    return tp if tp.trees else None


def tree_cpu(costs: RuntimeCosts, lab: LabProfile | None = None) -> TreeCpu:
    """The CPU each member spends in a `trees` sync of a stage (module docstring): the tree
    runtime's per-rank model at the chunk count the runtime derives from the schedule's
    `chunk_bytes` (`topocontract.trees.chunk_count`, fp32 gradients)."""

    def cpu(sched: TreeSchedule, size: float) -> list[float]:
        shape = tree_shape([t.parents for t in sched.trees], [t.rate for t in sched.trees])
        c = chunk_count(sched, max(1, int(size) // 4), 4)
        return [float(x) for x in rank_cpu(shape, size, c, costs, lab)]

    return cpu


def ps_allreduce(members: Sequence[str], server: str, size: float) -> Schedule:
    """The parameter server's schedule over `members`: each worker -> `server` (`size`
    bytes, all at once), then `server` -> each worker once every push arrived. 2(m - 1) steps,
    O(m)."""
    workers = [h for h in members if h != server]
    push = [Step(h, server, float(size)) for h in workers]
    pulled = tuple(range(len(push)))
    return Schedule("ps-allreduce", tuple(members),
                    tuple(push + [Step(server, h, float(size), pulled) for h in workers]))


def sync_schedule(members: Sequence[str], sync: dict, size: float) -> Schedule | None:
    """The schedule of a stage's `sync` (`topocontract.stages`) for `size` gradient bytes;
    None when nothing moves (`none`, one member, no gradient)."""
    if sync["kind"] == "none" or len(members) < 2 or size <= 0:
        return None
    if sync["kind"] == "ps":
        return ps_allreduce(members, sync["server"], size)
    if sync["kind"] == "trees":
        return tree_allreduce_schedule(members, size, TreeSchedule.model_validate(
            sync["schedule"]), TREE_MAX_CHUNKS)
    return ring_allreduce(members, size)


def sync_tasks(tid: str, members: Sequence[str], sync: dict, size: float,
               deps: tuple[str, ...], cpu: CpuCost | None = None,
               trees_cpu: TreeCpu | None = None) -> tuple[list[Task], dict[str, str]]:
    """The tasks of one stage's sync after `deps`: the collective, then (with `cpu`) each
    member's CPU for it; a `trees` sync's CPU (`trees_cpu`) runs alongside the collective
    (module docstring). Returns (tasks, member -> the task its step waits for)."""
    sched = sync_schedule(members, sync, size)
    if sched is None:
        return [], dict.fromkeys(members, deps[0]) if len(deps) == 1 else {}
    tasks: list[Task] = [Collective(tid, sched, deps)]
    done = dict.fromkeys(members, tid)
    if sync["kind"] == "trees":
        if trees_cpu is not None:
            for i, (h, sec) in enumerate(zip(members, trees_cpu(
                    TreeSchedule.model_validate(sync["schedule"]), size), strict=True)):
                tasks.append(Compute(f"{tid}/cpu.{i}", h, sec, deps, communication=True))
                tasks.append(Compute(f"{tid}/join.{i}", h, 0.0, (tid, f"{tid}/cpu.{i}")))
                done[h] = f"{tid}/join.{i}"
        return tasks, done
    if cpu is not None:
        for i, h in enumerate(members):
            server = sync["kind"] == "ps" and h == sync.get("server")
            seconds = cpu(sync["kind"], size, len(members), server)
            if seconds > 0:
                tasks.append(Compute(f"{tid}/cpu.{i}", h, seconds, (tid,), communication=True))
                done[h] = f"{tid}/cpu.{i}"
    return tasks, done


def sync_options(members: Sequence[str], trees: TreeSchedule | None = None,
                 servers: Sequence[str] | None = None) -> list[dict]:
    """What a stage of `members` may state, in tie-breaking order: ring, then a parameter
    server on each member in order (`servers`: only on those, e.g. one device per host, the
    one the plan can name), then `trees` when given; `none` alone for one member."""
    if len(members) < 2:
        return [{"kind": "none"}]
    allowed = set(members if servers is None else servers)
    return ([{"kind": "ring"}] + [{"kind": "ps", "server": h} for h in members
                                  if h in allowed]
            + ([{"kind": "trees", "schedule": trees.dump()}] if trees is not None else []))


def _key(opt: dict) -> str:
    return f"ps@{opt['server']}" if opt["kind"] == "ps" else opt["kind"]


def choose_sync(network: Network, members: Sequence[str], size: float,
                cpu: CpuCost | None = None, trees: TreeSchedule | None = None,
                trees_cpu: TreeCpu | None = None, servers: Sequence[str] | None = None
                ) -> tuple[dict, dict[str, float]]:
    """The fastest sync of a stage (module docstring) and every option's simulated seconds
    (keys ``ring``, ``ps@<host>``, ``trees``; `trees`: a schedule over the members to offer,
    `trees_cpu` its CPU model; `servers`: the members a server may run on, default all).
    A stage without gradients keeps the ring (nothing moves)."""
    options = sync_options(members, trees, servers)
    if len(options) == 1 or size <= 0:
        return options[0], {}
    times: dict[str, float] = {}
    best, best_t = options[0], float("inf")
    for opt in options:
        tasks, _ = sync_tasks("sync", members, opt, size, (), cpu, trees_cpu)
        t = simulate(tasks, network, record=False).iteration_time
        times[_key(opt)] = t
        if t < best_t:  # strict: ties keep the earlier option
            best, best_t = opt, t
    return best, times
