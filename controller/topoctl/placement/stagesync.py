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

Packed spanning trees (Wang et al., INFOCOM'21; `collective.trees`) over the stage's group,
when the caller passes a tree schedule (`trees`): its AllReduce
(`collective.trees.simulate.tree_allreduce_schedule`, pipelined in at most 16 chunks per tree),
network part only. The placement strategies do not offer them yet: the tree runtime's CPU part
is modelled for whole-cluster trees only, and on the network alone packed trees win nearly
everywhere (on a ring of equal cables too: they use the direction gloo's ring leaves idle).

`choose_sync` decides by simulation, on the plan's own network (routes, link rates and
latencies; in the lab the shared cores): each option of a stage as a `Collective` after which
each member pays its CPU for it, the fastest kept; ties go to the ring, then to the earlier
host. Deterministic. O((m + 1) * simulation of one collective) per stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from topocontract.schedule import TreeSchedule
from topoctl.collective.trees.simulate import tree_allreduce_schedule
from topoctl.sim.engine import simulate
from topoctl.sim.network import Network
from topoctl.sim.schedules import Schedule, Step, ring_allreduce
from topoctl.sim.tasks import Collective, Compute, Task

__all__ = ["choose_sync", "ps_allreduce", "sync_schedule", "sync_tasks"]

TREE_MAX_CHUNKS = 16  # chunks per tree the simulator models at most (planning speed)
# (sync kind, bytes, members, is the server) -> CPU seconds of one member; None: not modelled
CpuCost = Callable[[str, float, int, bool], float]


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
               deps: tuple[str, ...], cpu: CpuCost | None = None
               ) -> tuple[list[Task], dict[str, str]]:
    """The tasks of one stage's sync after `deps`: the collective, then (with `cpu`) each
    member's CPU for it. Returns (tasks, member -> the task its step waits for)."""
    sched = sync_schedule(members, sync, size)
    if sched is None:
        return [], dict.fromkeys(members, deps[0]) if len(deps) == 1 else {}
    tasks: list[Task] = [Collective(tid, sched, deps)]
    done = dict.fromkeys(members, tid)
    if cpu is not None:
        for i, h in enumerate(members):
            server = sync["kind"] == "ps" and h == sync.get("server")
            seconds = cpu(sync["kind"], size, len(members), server)
            if seconds > 0:
                tasks.append(Compute(f"{tid}/cpu.{i}", h, seconds, (tid,)))
                done[h] = f"{tid}/cpu.{i}"
    return tasks, done


def sync_options(members: Sequence[str], trees: TreeSchedule | None = None) -> list[dict]:
    """What a stage of `members` may state, in tie-breaking order: ring, then a parameter
    server on each member in order, then `trees` when given; `none` alone for one member."""
    if len(members) < 2:
        return [{"kind": "none"}]
    return ([{"kind": "ring"}] + [{"kind": "ps", "server": h} for h in members]
            + ([{"kind": "trees", "schedule": trees.dump()}] if trees is not None else []))


def _key(opt: dict) -> str:
    return f"ps@{opt['server']}" if opt["kind"] == "ps" else opt["kind"]


def choose_sync(network: Network, members: Sequence[str], size: float,
                cpu: CpuCost | None = None, trees: TreeSchedule | None = None
                ) -> tuple[dict, dict[str, float]]:
    """The fastest sync of a stage (module docstring) and every option's simulated seconds
    (keys ``ring``, ``ps@<host>``, ``trees``). A stage without gradients keeps the ring
    (nothing moves)."""
    options = sync_options(members, trees)
    if len(options) == 1 or size <= 0:
        return options[0], {}
    times: dict[str, float] = {}
    best, best_t = options[0], float("inf")
    for opt in options:
        tasks, _ = sync_tasks("sync", members, opt, size, (), cpu)
        t = simulate(tasks, network, record=False).iteration_time
        times[_key(opt)] = t
        if t < best_t:  # strict: ties keep the earlier option
            best, best_t = opt, t
    return best, times
