"""Re-plan a job on its cluster without the cables that failed (`topoctl run --heal`).

The cluster loses the cables (for a switched fabric: the NICs' attachments), must still connect
every host of the job, and is planned through the planner's normal entry point with the strategy
the running plan used (`trees` re-packs its spanning trees around the gap; a data-parallel run
cannot switch to a pipeline mid-training). Every remaining cable keeps its addresses
(`renumber.keep_addresses`)."""

from __future__ import annotations

from topoagent.protocol import TopoError
from topoctl.rollout.links import Cable
from topoctl.rollout.renumber import keep_addresses
from topoctl.spec.cluster import Cluster
from topoctl.spec.job import Job

# data-parallel strategies whose checkpoint (one full copy of the parameters per host) a
# re-planned run can resume from; topoopt re-cables the fabric itself, pipelines split the model
HEALABLE = ("baseline", "trees")


class HealError(TopoError, RuntimeError):
    """The run cannot be healed: the cluster would be disconnected, the plan's strategy cannot
    resume from a checkpoint, the cluster or job do not belong to the plan."""


def without_cables(cluster: Cluster, cables: list[Cable]) -> Cluster:
    """`cluster` with `cables` unplugged: direct links removed, switch attachments of the NICs
    removed (bare-host and star attachments are expanded per NIC first). Pure."""
    fabric = cluster.to_dict()["fabric"]
    cut = {frozenset((c.a, c.b)) for c in cables}
    if fabric["kind"] == "direct":
        fabric["links"] = [ln for ln in fabric.get("links", [])
                           if frozenset((ln["a"], ln["b"])) not in cut]
    else:
        gone = {c.a for c in cables} | {c.b for c in cables}
        fabric["attach"] = [at.model_dump(mode="json", exclude_none=True) | {"port": port}
                            for port, at in cluster.attachments() if port not in gone]
    return cluster.with_fabric(fabric)


def components(cluster: Cluster, hosts: list[str]) -> list[list[str]]:
    """The groups of `hosts` that reach each other over the cluster's fabric (switches and
    other hosts may forward), each sorted, in order of their first host."""
    g = cluster.graph()
    left, out = list(hosts), []
    while left:
        seen, todo = {left[0]}, [left[0]]
        while todo:
            for nb, _ in g.neighbours(todo.pop()):
                if nb not in seen:
                    seen.add(nb)
                    todo.append(nb)
        out.append(sorted(h for h in left if h in seen))
        left = [h for h in left if h not in seen]
    return out


def check_healable(plan: dict, cluster: Cluster, job: Job) -> None:
    """HealError unless `cluster` and `job` are the ones the plan came from and its strategy can
    resume from a checkpoint (checked before training starts, not after a cable fails)."""
    meta = plan.get("metadata") or {}
    problems = []
    if meta.get("cluster") != cluster.name:
        problems.append(("--cluster", f"cluster {cluster.name!r}, but the plan was made for "
                                      f"{meta.get('cluster')!r}"))
    if meta.get("job") != job.name:
        problems.append(("--job", f"job {job.name!r}, but the plan was made for "
                                  f"{meta.get('job')!r}"))
    strategy = str(meta.get("strategy", ""))
    if strategy.split("+")[0] not in HEALABLE:
        problems.append(("metadata.strategy", f"{strategy!r}: --heal resumes data-parallel "
                                              f"plans ({', '.join(HEALABLE)}, also with "
                                              "+bandwidth) from a checkpoint"))
    if problems:
        raise HealError(problems)


def replan(plan: dict, cluster: Cluster, job: Job, cables: list[Cable]) -> dict:
    """The plan for `job` on `cluster` without `cables`, with the strategy `plan` used; HealError
    when the job's hosts would no longer be connected."""
    from topoctl.planner import make_plan  # torch: only when re-planning

    left = without_cables(cluster, cables)
    hosts = list(job.hosts or [h.name for h in cluster.hosts])
    parts = components(left, hosts)
    names = ", ".join(c.name for c in cables)
    if len(parts) > 1:
        raise HealError(f"without {names} the cluster is disconnected: "
                        + " | ".join("{" + ", ".join(p) + "}" for p in parts))
    same = job.model_copy(update={"strategies": [plan["metadata"]["strategy"]]})
    doc, _, _ = make_plan(left, same)
    return keep_addresses(doc, plan)  # only the lost cable's ports lose theirs
