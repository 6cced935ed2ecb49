"""The plan's ``job.collective`` as the training runtime reads it: which gradient sync a job
runs, checked the same way wherever a plan is read (`topoctl apply`, `topoctl run`, `topo-agent
launch`: `topoagent.state.wire.parse_launch_spec`), so that a plan the runtime would not run as
written is refused before any rank starts, never run some other way.

``algorithm``: ``ring`` (DDP's ring AllReduce, in the plan's host ``order``), ``trees`` (the
packed spanning trees of ``schedule``, a `topocontract.schedule.TreeSchedule` for the job's
world size) or ``pipeline`` (pipeline stages, `topocontract.stages`); with
``hierarchical: {local_size: k}`` the schedule is over the hosts (the job's ranks / k); a
collective without one
(or no collective) is DDP's own. Import-light: no torch; O(ranks x trees)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from topocontract.schedule import TreeSchedule

ALGORITHMS = ("ring", "trees", "pipeline")


def collective_problems(collective: Any, world_size: int,
                        prefix: str = "job.collective") -> list[tuple[str, str]]:
    """Every problem (YAML path under `prefix`, message) of a job's collective for a job of
    `world_size` ranks: an algorithm the runtime does not have, a tree schedule that is
    missing, malformed or made for another world size. Empty when valid."""
    if not collective:
        return []
    if not isinstance(collective, dict):
        return [(prefix, f"expected a mapping, got {type(collective).__name__}")]
    algo = collective.get("algorithm")
    if algo is None:
        return []
    if algo not in ALGORITHMS:
        return [(f"{prefix}.algorithm", f"{algo!r} is not one the runtime has (one of "
                                        f"{', '.join(ALGORITHMS)})")]
    if algo != "trees":
        return []
    # hosts of several ranks (`topocontract.hierarchy`): the trees are over the hosts, one
    # schedule rank per host, each local rank's shard running on them
    hier = collective.get("hierarchical")
    local = hier.get("local_size") if isinstance(hier, dict) else None
    if isinstance(local, int) and not isinstance(local, bool) and local > 0:
        if world_size % local:
            return [(f"{prefix}.hierarchical.local_size",
                     f"{local} does not divide the job's {world_size} ranks")]
        world_size //= local
    return _schedule_problems(collective.get("schedule"), world_size, f"{prefix}.schedule")


def _schedule_problems(doc: Any, world_size: int, at: str) -> list[tuple[str, str]]:
    """A `trees` collective's schedule: present, valid, for `world_size` ranks."""
    if not isinstance(doc, dict):
        return [(at, "algorithm trees needs a tree schedule (a mapping)")]
    try:
        sched = TreeSchedule.model_validate(doc)
    except ValidationError as e:
        return [(f"{at}.{'.'.join(str(x) for x in err['loc'])}" if err["loc"] else at,
                 err["msg"]) for err in e.errors()]
    if sched.world_size != world_size:
        return [(f"{at}.world_size", f"{sched.world_size}: the job runs {world_size} ranks")]
    return []
