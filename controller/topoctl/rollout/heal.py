"""`topoctl run --heal`: training that survives a failed cable.

The loop: run the plan's ranks with checkpoints every N iterations (`run_job`, whose launchers
watch the carrier of every interface the plan routes training over); when a cable fails, every
rank is stopped (`run_job` returns with `links_down`), the job is re-planned on the cluster
without the failed cables with the plan's own strategy (`replan`), the new plan is applied to
every host with the normal two-phase apply, and the ranks are launched again, resuming from the
newest checkpoint. Each heal is reported with its steps' durations and the new plan's predicted
iteration time against the one measured after the resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from topoagent.protocol import EXIT_CHANGES, EXIT_OK, TopoError
from topoctl.rollout import twophase
from topoctl.rollout.links import Cable, cable_at
from topoctl.rollout.replan import check_healable, replan
from topoctl.rollout.run import RunResult, rank_user, run_job
from topoctl.rollout.transports import Transport
from topoctl.spec.cluster import Cluster
from topoctl.spec.job import Job

CHECKPOINT_EVERY = 10  # iterations; a checkpoint costs one torch.save per host (~20 ms at 16 MB)
MAX_HEALS = 3  # cables that may fail in one run before it gives up


@dataclass
class Heal:
    """One failed cable and how the run got going again. Times: `detected_at` is the agent's
    wall clock when it first saw the carrier gone; each `*_s` a step's duration in seconds:
    reported (agent -> controller), stop (every rank stopped), replan, apply, relaunch (launch
    requested -> first resumed iteration done); total = detected_at -> first resumed
    iteration."""

    cable: str
    reported_by: list[str]
    peer: str | None
    detected_at: float
    reported_s: float
    stop_s: float
    replan_s: float = 0.0
    apply_s: float = 0.0
    relaunch_s: float | None = None
    total_s: float | None = None
    resumed_from: int | None = None
    iterations_redone: int | None = None
    predicted_before: float | None = None
    measured_before: float | None = None
    predicted_after: float | None = None
    measured_after: float | None = None
    plan_file: str | None = None
    apply: str = ""


@dataclass
class HealResult:
    """The outcome of a healing run: exit code, every run segment, every heal, the final plan."""

    exit_code: int
    segments: list[RunResult]
    heals: list[Heal] = field(default_factory=list)
    failure: str = ""
    plan: dict = field(default_factory=dict)

    @property
    def last(self) -> RunResult:
        """The last segment (the one that finished training, when it did)."""
        return self.segments[-1]

    @property
    def seconds(self) -> float:
        """Wall time of the whole run, heals included."""
        first, last = self.segments[0], self.segments[-1]
        return last.started_at + last.seconds - first.started_at

    def to_dict(self) -> dict:
        """The `--json` document of `topoctl run --heal`: the last segment's result plus the
        heals and every segment's summary."""
        return self.last.to_dict() | {
            "exit_code": self.exit_code, "failure": self.failure,
            "seconds": round(self.seconds, 3),
            "heals": [asdict(h) for h in self.heals],
            "segments": [{"seconds": round(s.seconds, 3), "iteration_time": s.iteration_time,
                          "resumed_from": s.resumed_from, "exit_code": s.exit_code,
                          "links_down": s.links_down} for s in self.segments]}


def run_healing(plan: dict, transport: Transport, cluster: Cluster, job: Job,
                iterations: int = 10, every: int = CHECKPOINT_EVERY,
                out: Callable[[str], None] = print, verbose: bool = False,
                timeout: float | None = None, max_heals: int = MAX_HEALS,
                confirm_within: float | None = None,
                save: Callable[[dict, int], str | None] = lambda plan, n: None,
                user: str | None = None) -> HealResult:
    """Train under `plan`, healing around failed cables (at most `max_heals`); `cluster` and
    `job` are the ones the plan came from (HealError when not, before anything starts); `save`
    writes each re-planned plan and returns where; `user`: the ranks' user (`run --user`)."""
    check_healable(plan, cluster, job)
    user = rank_user(plan, user)  # the re-planned plans keep the first one's choice
    # the planner imports torch and captures the model: done now, in the background, so a
    # heal's re-plan does not pay for it
    threading.Thread(target=_warm_planner, daemon=True).start()
    result = HealResult(1, [], plan=plan)
    cut: list[Cable] = []
    resume = False
    while True:
        seg = run_job(plan, transport, iterations, out=out, verbose=verbose, timeout=timeout,
                      checkpoint={"every": every, "resume": resume}, user=user)
        result.segments.append(seg)
        if result.heals:
            _resumed(result.heals[-1], result.segments[-2], seg)
        if seg.exit_code == 0 or not seg.links_down:
            result.exit_code, result.failure = seg.exit_code, seg.failure
            return result
        heal = _failed(seg, plan)
        result.heals.append(heal)
        if len(result.heals) > max_heals:
            result.failure = f"{seg.failure}\n--heal gave up: more than {max_heals} cables failed"
            return result
        cut += [c for c in _cables(seg, plan) if c not in cut]
        out(f"healing: re-planning {job.name} on {cluster.name} without "
            f"{', '.join(c.name for c in cut)}")
        try:
            t = time.perf_counter()
            new = replan(plan, cluster, job, cut)
            heal.replan_s = time.perf_counter() - t
        except TopoError as e:  # HealError (disconnected), or the planner refusing the rest
            result.failure = f"{seg.failure}\ncannot heal: {e}"
            return result
        heal.predicted_after = new["metadata"]["prediction"]["iteration_time"]
        heal.plan_file = save(new, len(result.heals))
        out(f"healing: new {new['metadata']['strategy']} plan, predicted "
            f"{heal.predicted_after:.3f} s/iteration (was {heal.predicted_before:.3f} s); "
            "applying it to every host")
        t = time.perf_counter()
        report = twophase.apply_plan(new, transport, confirm_within=confirm_within)
        heal.apply_s, heal.apply = time.perf_counter() - t, report.message
        if report.exit_code not in (EXIT_OK, EXIT_CHANGES):  # the detailed outcome
            result.failure = f"{seg.failure}\ncannot heal: the new plan's apply failed: " \
                             f"{report.message}"
            return result
        out(f"healing: applied in {heal.apply_s:.1f} s; relaunching from the last checkpoint")
        plan, resume, result.plan = new, True, new


def _failed(seg: RunResult, plan: dict) -> Heal:
    """The Heal record of the segment's first failed cable, with the detection timings."""
    first = seg.links_down[0]
    name = first["cable"]
    ends = [d for d in seg.links_down if d["cable"] == name]
    detected = min(float(d["at"] or d["received"]) for d in ends)
    stopped = seg.started_at + seg.seconds
    return Heal(cable=name, reported_by=[f"{d['host']}:{d['interface']}" for d in ends],
                peer=first["peer"], detected_at=detected,
                reported_s=max(0.0, first["received"] - detected),
                stop_s=max(0.0, stopped - first["received"]),
                predicted_before=plan["metadata"]["prediction"]["iteration_time"],
                measured_before=seg.iteration_time)


def _cables(seg: RunResult, plan: dict) -> list[Cable]:
    """The cables of the segment's link-down reports (reports without a cable of the plan's
    fabric are not healable here and were reported as such)."""
    out = []
    for d in seg.links_down:
        c = cable_at(plan.get("fabric") or {}, d["host"], d["interface"])
        if c is not None and c not in out:
            out.append(c)
    return out


def _resumed(heal: Heal, before: RunResult, after: RunResult) -> None:
    """Complete `heal` from the segment that resumed after it."""
    if after.first_iteration_at is not None:
        heal.relaunch_s = after.first_iteration_at - after.started_at
        heal.total_s = after.first_iteration_at - heal.detected_at
    heal.resumed_from = after.resumed_from or 0
    done = max((len(r.iterations) for r in before.ranks.values()), default=0)
    start = before.resumed_from or 0
    heal.iterations_redone = max(0, start + done - heal.resumed_from)
    heal.measured_after = after.iteration_time


def _warm_planner() -> None:
    try:
        import topoctl.planner  # noqa: F401 - imports torch and the strategies
    except Exception:  # the re-plan itself reports whatever is wrong
        pass
