"""The simulator's per-phase prediction of a pipeline plan's ranks, in the phases the lab's
pipeline runtime reports (`topotrain.pipeline`: forward, backward, allreduce, step, other):
each rank's compute tasks (`strategies.placement.pipeline_tasks` chains them in the rank's
program order) split at its first backward, its stage's sync and its step, timed by one
simulated iteration (`SimResult.finish`).

    python -m bench.placement.hybrid_phases CLUSTER JOB [--replicas 3] [--shape 2 1] [--sync ring]

prints the predicted phases per stage (median over the stage's replicas), for comparison with
`bench.placement.hybrid_lab_check`'s measured ``stage s:`` lines."""

from __future__ import annotations

import statistics
import sys
import time

from topoagent.cliutil import ArgumentParser
from topoctl.planner import Evaluated, prepare, render
from topoctl.sim.engine import SimResult, simulate
from topoctl.sim.tasks import Compute
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import load_job
from topoctl.strategies.placement import search, search_shape

PHASES = ("forward", "backward", "allreduce", "step", "other")


def rank_phases(tasks: list, res: SimResult, stage: int, host: str) -> dict[str, float]:
    """Seconds of each runtime phase of the rank of `stage` on `host` in `res` (recorded): the
    forward runs from its input batch to its last forward-part task (sends included), the
    backward to its last task before the sync, the sync to the later of the collective and
    the rank's sync CPU, the step to its step, and `other` is the input batch, the loss
    all-reduce and the wait for the iteration's end."""
    mine = [t.id for t in tasks if isinstance(t, Compute) and t.device == host]
    fin = res.finish
    inputs = [t for t in mine if t.startswith("in")]
    t_in = max((fin[t] for t in inputs), default=0.0)
    step = next(t for t in mine if t.startswith(f"step{stage}."))
    i_step = mine.index(step)
    first_b = next(i for i, t in enumerate(mine) if t.startswith(f"B{stage}.")
                   or t.startswith("grad"))
    fwd_end = fin[mine[first_b - 1]] if first_b else t_in
    before_sync = [t for t in mine[:i_step] if not t.startswith(f"ar{stage}")]
    bwd_end = fin[before_sync[-1]]
    sync_ids = [t for t in mine[:i_step] if t.startswith(f"ar{stage}")]
    ar_end = max([fin[t] for t in sync_ids] + ([fin[f"ar{stage}"]] if f"ar{stage}" in fin
                                                 else []) + [bwd_end])
    step_end = fin[step]
    return {"forward": fwd_end - t_in, "backward": bwd_end - fwd_end,
            "allreduce": ar_end - bwd_end, "step": step_end - ar_end,
            "other": res.iteration_time - (step_end - t_in)}


def stage_phases(tasks: list, res: SimResult, groups: list[list[str]]
                 ) -> list[dict[str, float]]:
    """Per stage the median over its replicas of `rank_phases`."""
    out = []
    for s, grp in enumerate(groups):
        per = [rank_phases(tasks, res, s, h) for h in grp]
        out.append({k: statistics.median(p[k] for p in per) for k in PHASES})
    return out


def format_phases(phases: list[dict[str, float]]) -> list[str]:
    """One line per stage, as `bench.planner.lab_check` prints the measured ones."""
    return [f"  predicted stage {s}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in p.items())
            for s, p in enumerate(phases)]


def shaped_plan(cluster_file: str, job_file: str, replicas: int, sync: str | None,
                shape: list[int] | None = None) -> tuple[dict, list[dict[str, float]]]:
    """The plan of the job's pipeline with `replicas` replicas per stage (sync chosen by
    simulation, or `ring` on every stage; `shape`: the stages' replica counts instead), its
    prediction simulated as the planner does, on op times measured now (`retime`), and the
    prediction's phases per stage (`stage_phases`): what `bench.placement.hybrid_lab_check`
    measures."""
    ctx = prepare(load_cluster(cluster_file), load_job(job_file), retime=True)
    t0 = time.perf_counter()
    name = f"hybrid-{sync or 'chosen'}"
    s = (search_shape(ctx, shape, name, sync) if shape else
         search(ctx, "partition", name, replicas=replicas, split=True, sync=sync))
    res = simulate(s.tasks, s.network)  # recorded: the phases need every task's finish
    ev = Evaluated(s, res, time.perf_counter() - t0)
    groups = [st["hosts"] for st in s.collective["stages"]]
    return render(ctx, ev, [ev]), stage_phases(s.tasks, res, groups)


def cli(argv: list[str] | None = None) -> int:
    """Plan the shape as `bench.placement.hybrid_lab_check` does (op times re-timed)
    and print it."""
    ap = ArgumentParser(prog="python -m bench.placement.hybrid_phases", description=__doc__)
    ap.add_argument("cluster")
    ap.add_argument("job")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--shape", type=int, nargs="+")
    ap.add_argument("--sync", choices=["ring"])
    a = ap.parse_args(argv)
    doc, phases = shaped_plan(a.cluster, a.job, a.replicas, a.sync, a.shape)
    print(f"predicted {doc['metadata']['prediction']['iteration_time']:.4f} s")
    print("\n".join(format_phases(phases)))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
