"""A hybrid plan in the lab, predicted vs measured (root): plan one pipeline shape of a job on
a cluster (`--replicas` replicas per stage, the contiguous partition, no no-split candidate),
once with each stage's sync chosen by simulation (`placement.stagesync.choose_sync`: ring or a
parameter server on one of the stage's hosts) and once with the ring on every stage, then
measure both plans in the lab side by side with `bench.planner.lab_check` (round by round,
medians of `--repeats`).

    python -m bench.placement.hybrid_lab_check bench/hybrid/stars6-cluster.yaml \
        bench/hybrid/mlp-hybrid-job.yaml [iters] [--replicas 3] [--repeats 3] [--keep DIR]
    python -m bench.placement.hybrid_lab_check CLUSTER JOB [iters] --shape 2 1   # unequal replicas

`--shape` fixes the stages' replica counts instead (stage s on the next shape[s] hosts,
`strategies.placement.search_shape`: the replicas of a stage split each micro-batch's rows).

The planner itself would keep the whole model on one host for these small lab jobs (the
shared cores make a split pay little, docs/placement.md); this checks the prediction of the
shape the issue asks for (two stages, replicated), and whether the sync the simulator picks
is the faster one in the lab."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import yaml

from bench.common import MIN_TIMED_SECONDS
from bench.placement.hybrid_phases import format_phases, shaped_plan
from bench.planner.lab_check import check, median_table
from topoagent.cliutil import ArgumentParser
from topoctl.render.yamlout import dump as dump_plan


def main(cluster_file: str, job_file: str, iterations: int = 5, replicas: int = 3,
         repeats: int = 1, keep: Path | None = None,
         min_seconds: float = MIN_TIMED_SECONDS, shape: list[int] | None = None,
         syncs: tuple = (None, "ring")) -> int:
    job = yaml.safe_load(Path(job_file).read_text())
    tmp = Path(tempfile.mkdtemp(prefix="hybrid-lab-"))
    plans = []
    for sync in syncs:
        doc, phases = shaped_plan(cluster_file, job_file, replicas, sync, shape)
        path = tmp / f"{doc['metadata']['strategy']}.yaml"
        path.write_text(dump_plan(doc))
        stages = doc["job"]["collective"]["stages"]
        print(f"{doc['metadata']['strategy']}: predicted "
              f"{doc['metadata']['prediction']['iteration_time']:.3f} s; " + "; ".join(
                  f"stage {i} {','.join(st['hosts'])} sync {st['sync']['kind']}"
                  + (f" on {st['sync']['server']}" if 'server' in st['sync'] else "")
                  for i, st in enumerate(stages)) + f" (plan {path})")
        comp = doc["metadata"].get("collective", {}).get("compute") or {}
        if "crowding" in comp:  # what the prediction charges the crowded cores
            print(f"  inputs {comp['inputs_s'] * 1e3:.2f} ms per rank, crowding "
                  f"{comp['crowding']:.3f} per unit of oversubscription")
        print("\n".join(format_phases(phases)))
        plans.append(yaml.safe_load(path.read_text()))
    sys.stdout.flush()
    rows = []
    for k in range(repeats):
        for doc in plans:
            row = check(cluster_file, dict(job), iterations, doc, min_seconds, keep,
                        f"r{k + 1}" if repeats > 1 else "")
            if row is None:
                return 1
            rows.append(row)
    print()
    print("\n".join(median_table(rows)))
    return 0


def cli(argv: list[str] | None = None) -> int:
    """Parse the command line and run `main`."""
    ap = ArgumentParser(prog="python -m bench.placement.hybrid_lab_check", description=__doc__)
    ap.add_argument("cluster", help="cluster file (lab hosts: gpus.type cpu)")
    ap.add_argument("job", help="job file (a pipeline job)")
    ap.add_argument("iterations", nargs="?", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=3, help="replicas per stage")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="save each check's plan and rank outputs here")
    ap.add_argument("--shape", type=int, nargs="+", help="replicas of each stage (may differ)")
    ap.add_argument("--chosen-only", action="store_true",
                    help="measure only the plan whose syncs the simulator chose")
    a = ap.parse_args(argv)
    return main(a.cluster, a.job, a.iterations, a.replicas, a.repeats, a.keep,
                shape=a.shape, syncs=(None,) if a.chosen_only else (None, "ring"))


if __name__ == "__main__":
    sys.exit(cli())
