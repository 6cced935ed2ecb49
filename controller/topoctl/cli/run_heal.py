"""`topoctl run PLAN --heal --job JOB`: train, healing around failed cables (`rollout.heal`).

The job file is the one the plan was made from (`--job`, required); the cluster is `--cluster
FILE`, else the lab's own (the plan's lab, or `--lab`). Each re-planned plan is written beside
PLAN as `PLAN-STEM.heal<N>.yaml` (for `topoctl status`, `rollback`, `explain`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from topoagent.protocol import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK
from topoagent.state.host import StateError
from topoctl.cli.apply import confirm_window
from topoctl.cli.output import write_output
from topoctl.lab.emulated import as_emulated
from topoctl.lab.lab import Lab, list_labs
from topoctl.render.yamlout import dump
from topoctl.rollout.heal import Heal, HealResult, run_healing
from topoctl.rollout.replan import HealError
from topoctl.rollout.transports import Transport
from topoctl.spec.cluster import Cluster
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import Job, load_job


def heal_inputs(args: argparse.Namespace, plan: dict) -> tuple[Cluster, Job]:
    """The cluster and job to re-plan with; TopoError naming the flag when one is missing. On a
    lab whose kernel has no sch_netem the lab's cluster without the latency and loss it could
    not emulate (as `topoctl plan --as-lab` plans it), so the new plan's prediction is of
    what the lab runs."""
    if not args.job:
        raise StateError("--heal re-plans the job around a failed cable: give the job file "
                         "the plan was made from", source="--job")
    job = load_job(args.job)
    if args.cluster:
        cluster = load_cluster(args.cluster)
    else:
        lab_name = args.lab or plan["metadata"].get("cluster")
        if not lab_name or lab_name not in list_labs():
            raise StateError("--heal re-plans on the plan's cluster: give the cluster file "
                             "(or run on its lab)", source="--cluster")
        lab = Lab.load(lab_name)
        cluster = lab.cluster
        if not lab.netem:  # re-plan the cables as the lab has them: no latency, no loss
            emulated, cleared = as_emulated(cluster.to_dict())
            if cleared:
                cluster = parse_cluster(emulated, str(lab.state_dir / "lab.json"))
    return cluster, job


def cmd_run_heal(args: argparse.Namespace, plan: dict, transport: Transport) -> int:
    """Run with --heal; EXIT_OK trained and synchronous, EXIT_ERROR otherwise."""
    cluster, job = heal_inputs(args, plan)
    quiet = args.json
    out = (lambda s: None) if quiet else print

    def save(doc: dict, n: int) -> str | None:
        target = Path(args.plan).with_name(f"{Path(args.plan).stem}.heal{n}.yaml")
        try:
            write_output(str(target), dump(doc), flag="--heal")
        except StateError as e:
            out(f"healing: the new plan was not saved: {e}")
            return None
        return str(target)

    try:
        result = run_healing(plan, transport, cluster, job, iterations=args.iterations,
                             every=args.checkpoint_every, out=out, verbose=args.verbose,
                             timeout=args.timeout, max_heals=args.max_heals,
                             confirm_within=confirm_window(args, transport), save=save,
                             user=args.user)
    except HealError as e:  # before training: the plan, cluster and job do not go together
        raise (e if e.path.startswith("--") else e.at(args.plan)) from None
    finally:
        transport.close()
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        report(result, args.iterations)
    if result.segments and result.last.stopped:  # `topoctl stop`: interrupted, as Ctrl-C
        return EXIT_INTERRUPTED
    ok = result.exit_code == EXIT_OK and result.last.synchronous
    return EXIT_OK if ok else EXIT_ERROR


def report(result: HealResult, iterations: int) -> None:
    """The human summary: each heal with its timings and predictions, then the outcome."""
    for i, h in enumerate(result.heals, 1):
        print(_heal_text(i, h))
    if result.exit_code and result.segments and result.last.stopped:  # `topoctl stop`
        print(f"training {result.failure}")
        return
    if result.exit_code:
        print("training failed:\n  " + result.failure.replace("\n", "\n  "))
        return
    last = result.last
    it = last.iteration_time
    print(f"{len(last.ranks)} ranks, {iterations} iterations in {result.seconds:.1f} s "
          f"({len(result.heals)} heal{'s' * (len(result.heals) != 1)}); median iteration "
          f"{it:.3f} s since the last start; parameters identical on every rank: "
          f"{'yes' if last.synchronous else 'NO'}")


def _heal_text(i: int, h: Heal) -> str:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} s"

    def it(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    return (f"heal {i}: cable {h.cable} failed (reported by {', '.join(h.reported_by)}; peer "
            f"{h.peer})\n"
            f"  detect {s(h.reported_s)}, stop {s(h.stop_s)}, re-plan {s(h.replan_s)}, "
            f"apply {s(h.apply_s)}, relaunch {s(h.relaunch_s)}: training again "
            f"{s(h.total_s)} after the carrier was lost; resumed after iteration "
            f"{h.resumed_from} ({h.iterations_redone} redone)\n"
            f"  s/iteration predicted -> measured: before {it(h.predicted_before)} -> "
            f"{it(h.measured_before)}, after {it(h.predicted_after)} -> "
            f"{it(h.measured_after)}" + (f"\n  new plan: {h.plan_file}" if h.plan_file else ""))
