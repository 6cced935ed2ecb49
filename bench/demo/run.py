"""`make demo`: the main job, end to end on one machine.

Plan the demo's MLP job (bench/jobs/mlp-demo-job.yaml: 4.8 MB of gradients, 2048 samples) on
the heterogeneous 8-host cluster (plans/hetero8-cluster.yaml) with the
baseline and with every topology-aware strategy the planner has, and for each: build the
cluster as a lab of its own (namespaces, shaped cables, an sshd per host), apply the plan on
every host (two-phase, over the lab transport),
train under it (DDP over gloo between the hosts' training addresses), and compare the
simulator's prediction with the measurement. Then the same bandwidth-allocated plan
(`baseline+bandwidth`) through Open vSwitch on an OVS-marked copy of the cluster
(bench/demo/ovs.py; row `baseline+bandwidth (ovs)`, skipped with --no-ovs). Prints one table
(each row says what its plan is: hosts used, ring, trees, stages, bandwidth classes), saves it
as JSON and a PNG plot next to it, and tears each lab down (OVS daemons included), also when
interrupted.

By default the job's training step (and the tree runtime's CPU costs) is timed once, at the
start, and every strategy is planned with those timings; the pipeline strategies, which time
pipeline stages and the cores' crowding besides, are planned by a child process at idle
priority while the rows before theirs are measured (bench/demo/ahead.py: the CPU those
network-bound rows leave idle), the same plans the demo made itself before. `--careful`, for
figures that go into docs: every strategy is planned right before it is measured with its ops
timed again (this VM's speed moves within minutes), the whole run is repeated `--runs` times
(3) and the table gives the medians (bench/demo/median.py), each run's files in `OUT/run<k>/`.

    python -m bench.demo [--iterations N] [--min-seconds 6] [--out demo-results]
                         [--strategies baseline trees | --all] [--no-ovs]
                         [--careful [--runs 3]]

A strategy whose plan runs exactly as an earlier row's (`as_run`: the same fabric, host
state and job; e.g. TAG choosing the placement search's plan) is not run again: its row shows
its own prediction beside that row's measurement and says which row it is.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml

from bench.common import (
    CAREFUL_RUNS,
    DEMO_ITERATIONS,
    DEMO_ITERATIONS_CAREFUL,
    MIN_TIMED_SECONDS,
)
from bench.demo.ahead import Ahead, planned_ahead
from bench.demo.planning import CLUSTER, JOB, demo_cluster, job_document, plan_for
from bench.demo.summary import plan_summary
from topoagent.cliutil import ArgumentParser
from topoctl.rollout.run import iterations_for

T = TypeVar("T")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# `make demo`'s rows leave out the strategies below: each row costs 15-35 s on this 2-core VM
# (an 8-rank ring row about 34 s) and the demo has 4 minutes; `--all` adds them (the demo table
# in docs/results.md is an `--all` run). On this cluster batch shares change nothing (its hosts
# are equally fast: each row is the same plan as the one it post-passes) and TAG's plan is the
# placement search's (the same plan again); SFB and DisCo's buckets plan something of their own.
# A post-pass the demo keeps shows once, on the baseline (baseline+bandwidth, and its OVS row):
# trees+bandwidth is the trees' plan with rates the trees already meet (0.405 against 0.409 s/it
# predicted, 0.404 against 0.411 measured), 33 s of the demo for no new reading.
NOT_IN_DEMO = ("shares", "sfb", "disco", "tag")


def default_strategies(registry: dict, every: bool = False) -> list[str]:
    """The demo's rows: the baseline, then one row per strategy function of `registry` (an
    alias, "bandwidth" = "baseline+bandwidth", runs once under its longest, most descriptive
    name); unless `every`, without the post-passes of :data:`NOT_IN_DEMO` and with the others
    on the baseline only."""
    names: dict = {}
    for s, fn in sorted(registry.items()):
        parts = s.split("+")
        default = not any(p in parts for p in NOT_IN_DEMO) and (
            len(parts) == 1 or parts[0] == "baseline")
        if s != "baseline" and (every or default):
            names.setdefault(fn, []).append(s)
    return ["baseline"] + sorted(max(v, key=len) for v in names.values())


def as_run(plan: dict) -> dict:
    """What of `plan` the hosts apply and the ranks run: its `fabric`, `hosts` and `job`
    sections, an even `job.batch.shares` left out (the runtime's weighted average with equal
    weights is the plain one: `+shares` on equally fast hosts changes nothing). Two plans
    with the same `as_run` are one measurement."""
    job = dict(plan.get("job") or {})
    batch = dict(job.get("batch") or {})
    if len(set(batch.get("shares") or [])) <= 1:
        batch.pop("shares", None)
    job["batch"] = batch
    return {"fabric": plan.get("fabric"), "hosts": plan.get("hosts"), "job": job}


def same_plan_as(plan: dict, measured: list[tuple[T, dict]]) -> T | None:
    """The key (a strategy, a row) of the first (key, plan) pair in `measured` whose plan runs
    the same as `plan` (`as_run`), or None."""
    mine = as_run(plan)
    return next((key for key, p in measured if as_run(p) == mine), None)


def allreduce_optimum(plans: dict[str, dict]) -> float | None:
    """Seconds of the fastest AllReduce the fabric allows for the job's gradients: the packed
    trees' LP optimum (bytes/s, a property of the fabric, not of a strategy) when the planner
    computed one, applied to the gradient bytes."""
    for plan in plans.values():
        sched = plan["job"].get("collective", {}).get("schedule")
        if isinstance(sched, dict) and sched.get("metadata", {}).get("optimum_bytes_per_s"):
            grad = plan["metadata"]["model"]["parameters_bytes"]
            return grad / float(sched["metadata"]["optimum_bytes_per_s"])
    return None


def measure(name: str, plan: dict, transport, iterations: int) -> dict:
    from topoctl.rollout import twophase as rollout
    from topoctl.rollout.run import run_job

    t0 = time.perf_counter()
    report = rollout.apply_plan(plan, transport)
    if report.exit_code not in (0, 2):  # 2 (changes made) until the CLI's codes change
        raise SystemExit(f"{name}: apply failed: {report.message}")
    applied = time.perf_counter() - t0
    log(f"{name}: applied on {len(plan['hosts'])} hosts in {applied:.1f} s; training "
        f"{iterations} iterations")
    result = run_job(plan, transport, iterations=iterations,
                     out=lambda s: log(f"{name}: {s}") if s.startswith("iteration") else None)
    if result.exit_code or not result.synchronous:
        raise SystemExit(f"{name}: training failed: {result.failure or 'ranks diverged'}")
    return {"apply_seconds": applied, "measured": result.iteration_time,
            "run_seconds": result.seconds,
            **({"allreduce": result.allreduce_seconds} if result.allreduce_seconds else {})}


HEAD = ("strategy", "plan", "predicted s/it", "measured s/it", "prediction error",
        "speedup vs baseline", "measured/optimal AllReduce")


def table(rows: list[dict], optimum: float | None) -> str:
    """The demo's table: one line per row (`strategy`, `plan` as `plan_summary` gives it,
    `predicted`, `measured`)."""
    lines = [" | ".join(HEAD), " | ".join("-" * len(h) for h in HEAD)]
    base = next((r["measured"] for r in rows if r["strategy"] == "baseline"), None)
    for r in rows:
        err = (r["predicted"] - r["measured"]) / r["measured"]
        lines.append(" | ".join([
            r["strategy"], r.get("plan", "-"), f"{r['predicted']:.3f}", f"{r['measured']:.3f}",
            f"{err:+.1%}", f"{base / r['measured']:.2f}x" if base else "-",
            f"{r['measured'] / optimum:.2f}" if optimum else "-"]))
    return "\n".join(lines)


def plot(rows: list[dict], optimum: float | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{r['strategy']}\n{r['plan']}" if r.get("plan") else r["strategy"] for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([i - 0.2 for i in x], [r["predicted"] for r in rows], 0.4, label="predicted")
    ax.bar([i + 0.2 for i in x], [r["measured"] for r in rows], 0.4, label="measured")
    if optimum:
        ax.axhline(optimum, color="k", linestyle="dashed", label="optimal AllReduce")
    ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("seconds per iteration")
    ax.set_title("MLP on the heterogeneous 8-host lab")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


class Phases:
    """Wall-clock seconds per phase of a run (planning, lab up, apply, training, lab down,
    the OVS row), for the log's closing summary and results.json."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        """Count `seconds` towards `phase`."""
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def summary(self, total: float) -> str:
        """One line: each phase's seconds and the rest of `total`."""
        rest = total - sum(self.seconds.values())
        return ", ".join(f"{k} {v:.0f} s" for k, v in self.seconds.items()) + \
            f", other {rest:.0f} s (total {total:.0f} s)"


def row(cluster, s: str, plan: dict, k: int, args, phases: Phases) -> dict:
    """Measure plan `plan` of strategy `s` on a lab of its own (the `k`-th of this run)."""
    from topoctl.lab import lab as labmod
    from topoctl.rollout.transports.ssh import lab_ssh_transport

    # every strategy on a lab of its own, as bench/planner/lab_check.py measures: a row
    # must not inherit the one before it (the same topoopt plan measured 0.656-0.672 s per
    # iteration on a new lab, 0.680-0.709 s (once 0.662) after other strategies on the
    # same lab, predicted 0.648-0.663 s throughout);
    # a lab takes about a second to build and to remove
    name = f"dm{os.getpid() % 10**5}{k:02d}"  # at most 9 characters (k < 100)
    t0 = time.perf_counter()
    lab = labmod.up(cluster, name=name)
    phases.add("lab up/down", time.perf_counter() - t0)
    log(f"lab {name}: built {len(cluster.hosts)} hosts from {CLUSTER.name} in "
        f"{time.perf_counter() - t0:.1f} s")
    transport = lab_ssh_transport(lab)  # as on bare metal: each host's own sshd
    try:
        # a strategy that re-cables (topoopt) brings its own fabric: the lab's patch
        # panel follows the plan, as a real one would (no change for the others)
        changed = labmod.rewire(lab, plan["fabric"])
        if changed["removed"] or changed["added"]:
            log(f"{s}: re-cabled the lab ({len(changed['removed'])} cables out, "
                f"{len(changed['added'])} in)")
        meta = plan["metadata"]
        t0 = time.perf_counter()
        # `--iterations`, or more to cover `--min-seconds` of predicted time
        m = measure(s, plan, transport, iterations_for(
            meta["prediction"]["iteration_time"], args.iterations, args.min_seconds))
        phases.add("apply", m["apply_seconds"])
        phases.add("training", time.perf_counter() - t0 - m["apply_seconds"])
        r = {"strategy": s, "plan": plan_summary(plan),
             "predicted": meta["prediction"]["iteration_time"], **m}
        log(f"{s} ({r['plan']}): predicted {r['predicted']:.3f} s/it, measured "
            f"{m['measured']:.3f} s/it")
        if m.get("allreduce"):
            from topoctl.rollout.run import allreduce_summary, predicted_buckets

            r["allreduce_predicted"] = predicted_buckets(plan)
            log(f"{s}: {allreduce_summary(m['allreduce'], predicted_buckets(plan))}")
        return r
    finally:
        transport.close()
        t0 = time.perf_counter()
        labmod.down(name)
        phases.add("lab up/down", time.perf_counter() - t0)
        log(f"lab {name} removed")


def reused(s: str, plan: dict, twin: dict) -> dict:
    """The row of strategy `s` whose plan runs exactly as the measured row `twin`'s
    (`same_plan_as`): its own prediction beside `twin`'s measurement, not run a second time."""
    r = {"strategy": s, "plan": f"{plan_summary(plan)} (= {twin['strategy']})",
         "predicted": plan["metadata"]["prediction"]["iteration_time"],
         "measured": twin["measured"], "same_as": twin["strategy"]}
    log(f"{s}: the same plan as {twin['strategy']}; its measurement ({r['measured']:.3f} "
        f"s/it) is this row's too, predicted {r['predicted']:.3f} s/it")
    return r


def one_run(cluster, job_doc: dict, strategies: list[str], args, out: Path
            ) -> tuple[list[dict], dict[str, dict], Phases]:
    """Every row once: (rows, plans by strategy, phase times). Default: the step timed once
    and every strategy planned with it first, the pipeline strategies in a child process at
    idle priority while the rows before theirs are measured (`bench.demo.ahead`); careful:
    each strategy planned (timed again) right before it is measured."""
    from topoctl.graph.profile import forget_retimed

    phases = Phases()
    plans: dict[str, dict] = {}
    ahead = Ahead([] if args.careful else strategies, out, log)

    def planned(s: str) -> None:
        t0 = time.perf_counter()
        if s in ahead.strategies:
            plan, waited = ahead.plan(s)
            how = f"planned ahead (waited {waited:.1f} s for it)"
        else:
            plan = plan_for(cluster, job_doc, s)
            (out / f"plan-{s}.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
            how = f"planned in {time.perf_counter() - t0:.1f} s"
        plans[s] = plan
        phases.add("planning", time.perf_counter() - t0)
        log(f"{s}: {how}: {plan_summary(plan)}, predicted "
            f"{plan['metadata']['prediction']['iteration_time']:.3f} s/it")

    forget_retimed()  # this run times the step (and the runtime's CPU costs) again
    try:
        if not args.careful:
            for s in strategies:
                if not planned_ahead(s):
                    planned(s)
            ahead.start()  # after this process's timings: the child reads them
        rows = measure_rows(cluster, strategies, args, plans, planned, phases)
    finally:
        ahead.close()
    if not args.no_ovs:
        from bench.demo.ovs import ovs_row  # the OVS modules only when the row runs

        t0 = time.perf_counter()
        r = ovs_row(CLUSTER, job_doc, args.iterations, out, f"dovs{os.getpid() % 10**5}",
                    measure, log)
        phases.add("OVS row", time.perf_counter() - t0)
        rows.append(r)
        log(f"{r['strategy']} ({r['plan']}): predicted {r['predicted']:.3f} s/it, measured "
            f"{r['measured']:.3f} s/it")
    return rows, plans, phases


def measure_rows(cluster, strategies: list[str], args, plans: dict[str, dict],
                 planned: Callable[[str], None], phases: Phases) -> list[dict]:
    """The rows of `strategies` in order, each measured on a lab of its own unless its plan
    runs as an earlier row's (`same_plan_as`); `planned(s)` puts a strategy's plan into
    `plans` (careful: timed again right before; default: the child's plans as they come)."""
    from topoctl.graph.profile import forget_retimed

    rows: list[dict] = []
    for k, s in enumerate(strategies):
        if args.careful:
            # planned now, with its ops timed now: this VM's speed moves within minutes (a
            # plain training loop of the demo's MLP: 75 ms, then 99 ms 53 minutes later), so a
            # timing from the start of the demo can be 20% off by its end
            forget_retimed()
        if args.careful or s not in plans:
            planned(s)
        twin = same_plan_as(plans[s], [(r, plans[r["strategy"]]) for r in rows
                                       if r["strategy"] in plans and not r.get("same_as")])
        rows.append(reused(s, plans[s], twin) if twin else row(cluster, s, plans[s], k, args,
                                                               phases))
    return rows


def save(rows: list[dict], optimum: float | None, out: Path, extra: dict) -> str:
    """Write the run's table (results.md), rows (results.json) and plot; return the table."""
    text = table(rows, optimum)
    (out / "results.json").write_text(json.dumps({"rows": rows, "allreduce_optimum": optimum,
                                                  **extra}, indent=1))
    (out / "results.md").write_text(text + "\n")
    plot(rows, optimum, out / "results.png")
    return text


def main(argv: list[str] | None = None) -> int:
    # usage errors exit 1 (bad input), not argparse's 2 (= changes, README "Exit codes")
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int,
                    help=f"iterations per strategy, at least ({DEMO_ITERATIONS}; with "
                         f"--careful {DEMO_ITERATIONS_CAREFUL}; see --min-seconds)")
    ap.add_argument("--min-seconds", type=float, default=MIN_TIMED_SECONDS,
                    help="timed iterations per strategy cover at least this many predicted "
                         f"seconds ({MIN_TIMED_SECONDS:g}): a fast strategy's median is not left "
                         "to 6 samples nor to a tree plan's first, still settling iterations")
    ap.add_argument("--out", default="demo-results")
    ap.add_argument("--strategies", nargs="+")
    ap.add_argument("--all", action="store_true",
                    help="every strategy, the post-passes left out of the default rows "
                         "(batch shares, SFB, DisCo, TAG) included: about 5.5 minutes")
    ap.add_argument("--no-ovs", action="store_true",
                    help="skip the baseline+bandwidth row through Open vSwitch")
    ap.add_argument("--careful", action="store_true",
                    help="for figures that go into docs: time the step again right before "
                         "each strategy, repeat the whole run --runs times and print the "
                         "medians")
    ap.add_argument("--runs", type=int, default=CAREFUL_RUNS,
                    help=f"runs of --careful ({CAREFUL_RUNS}); their medians are the table")
    args = ap.parse_args(argv)
    if args.iterations is None:
        args.iterations = DEMO_ITERATIONS_CAREFUL if args.careful else DEMO_ITERATIONS
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if os.geteuid() != 0:
        print("the demo needs root (network namespaces)", file=sys.stderr)
        return 1
    from topoctl.strategies import available

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # predictions for the cables the lab really has (topoctl.lab.emulated)
    cluster, cleared = demo_cluster()
    if cleared:
        log(f"this kernel has no sch_netem: the lab cannot emulate {', '.join(cleared)}; "
            "planning the cluster as the lab emulates it (no latency, no loss)")
    job_doc = job_document()
    strategies = args.strategies or default_strategies(available(), every=args.all)
    t_start = time.perf_counter()
    runs = args.runs if args.careful else 1
    log(f"{JOB.name} on {cluster.name} with: {', '.join(strategies)}; " + (
        f"careful: {runs} runs, each strategy planned (its step timed again) right before "
        "it is measured" if args.careful else
        "the job's step timed once, every strategy planned with it"))
    os.environ.setdefault("TOPOCTL_LAB_DIR", str(out.resolve() / "labs"))
    results = []
    for k in range(runs):
        t_run = time.perf_counter()
        run_out = out / f"run{k + 1}" if args.careful else out
        run_out.mkdir(parents=True, exist_ok=True)
        if args.careful:
            log(f"run {k + 1} of {runs}")
        rows, plans, phases = one_run(cluster, job_doc, strategies, args, run_out)
        optimum = allreduce_optimum(plans)
        took = time.perf_counter() - t_run
        text = save(rows, optimum, run_out, {"phases": phases.seconds, "seconds": took,
                                             "careful": args.careful})
        log(f"phases: {phases.summary(took)}")
        results.append(run_out / "results.json")
    if args.careful:
        from bench.demo.median import median_rows, median_table

        text = median_table(results)
        mrows, optimum = median_rows(results)
        (out / "results.md").write_text(text + "\n")
        (out / "results.json").write_text(json.dumps(
            {"rows": mrows, "allreduce_optimum": optimum, "median_of": [str(p) for p in results]},
            indent=1))
        plot(mrows, optimum, out / "results.png")
    print()
    print(text)
    if optimum:
        grad_mb = plans[strategies[0]]["metadata"]["model"]["parameters_bytes"] / 1e6
        print(f"\noptimal AllReduce of the {grad_mb:.1f} MB of gradients on this fabric: "
              f"{optimum:.3f} s (packed-tree LP optimum); measured/optimal divides the "
              "measured iteration (AllReduce plus compute) by it.")
    one_host = [r["strategy"] for r in rows if r.get("plan", "").startswith("1 host")]
    if one_host:
        print(f"{', '.join(one_host)}: the plan trains on one host, the cables being slower "
              "than the compute they would spread; the speedup is that of not sending the "
              "gradients, not of a placement across hosts.")
    print(f"saved {out}/results.md, results.json, results.png; total "
          f"{time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
