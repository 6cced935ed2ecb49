"""Heal time in the lab: a cable cut during `topoctl run --heal`, and how long until training
runs again (root; issue 11's figure for the README's reliability section).

    python -m bench.agent.heal [--cluster plans/hetero8-cluster.yaml] [--job plans/mlp-job.yaml]
        [--strategy trees] [--cut h0:eth0] [--runs 3] [--iterations 30] [--every 5]
        [--cut-after 10] [--json out.json]

Builds the cluster as a lab (its own name, its own state directory, removed at the end), plans
the job with the one strategy, applies the plan, then per run: `topoctl run PLAN --heal --json`
(a subprocess, as a user runs it), cuts the cable at `--cut` (as `topoctl lab cut` does) once
the checkpoint after iteration `--cut-after` exists, and reads the run's heal report: the
time from the cut to the launchers seeing the carrier go, the stop, re-plan, apply and relaunch
durations, the total from the cut to the first resumed iteration, and the predicted against the
measured iteration time before and after. Between runs the cable is plugged back in and the
original plan re-applied. Prints each run and the medians, with the load average at the start
of each run; `--json` writes everything."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import ROOT
from topoagent.cliutil import ArgumentParser

STEPS = ("detect", "stop", "replan", "apply", "relaunch", "total")


def topoctl(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run the topoctl of this installation."""
    p = subprocess.run([sys.executable, "-m", "topoctl.cli", *map(str, args)],
                       capture_output=True, text=True, **kw)
    if check and p.returncode:  # 0 is success, changes made or not
        raise SystemExit(f"topoctl {' '.join(map(str, args))}: exit {p.returncode}\n"
                         f"{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p


def one_run(lab, plan: Path, job: Path, args, run_dir: Path) -> dict:
    """One `run --heal` with one cut; the heal report plus the bench's own cut time."""
    from topoctl.lab.lab import set_port

    load = os.getloadavg()[0]
    ckpt = lab.state_dir / "agent" / args.cut.split(":")[0] / "run" / "checkpoints" / \
        f"it-{args.cut_after}.pt"
    out = run_dir / "run.json"
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "topoctl.cli", "run", str(plan), "--lab",
                                 lab.name, "--heal", "--job", str(job), "--iterations",
                                 str(args.iterations), "--checkpoint-every", str(args.every),
                                 "--json"], stdout=f, stderr=subprocess.PIPE, text=True)
        try:
            while not ckpt.exists():
                if proc.poll() is not None:
                    raise SystemExit(f"the run ended before iteration {args.cut_after}: "
                                     f"{proc.stderr.read()[-2000:]}")
                time.sleep(0.05)
            set_port(lab, args.cut, False)
            cut_at = time.time()
            _, err = proc.communicate(timeout=1800)
        finally:
            if proc.poll() is None:  # the bench is failing: do not leave the run behind
                proc.kill()
                proc.wait()
    doc = json.loads(out.read_text())
    if proc.returncode != 0 or not doc.get("heals"):
        raise SystemExit(f"run --heal failed (exit {proc.returncode}): {doc.get('failure')}"
                         f"\n{err[-2000:]}")
    heal = doc["heals"][0]
    return {"load": round(load, 2), "cut_at": cut_at, "heal": heal, "synchronous":
            doc["synchronous"], "seconds": doc["seconds"],
            "detect": heal["detected_at"] - cut_at + heal["reported_s"],
            "stop": heal["stop_s"], "replan": heal["replan_s"], "apply": heal["apply_s"],
            "relaunch": heal["relaunch_s"],
            "total": heal["detected_at"] - cut_at + heal["total_s"]}


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the benchmark, print (and with --json write) the results."""
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", default=str(ROOT / "plans" / "hetero8-cluster.yaml"))
    p.add_argument("--job", default=str(ROOT / "plans" / "mlp-job.yaml"))
    p.add_argument("--strategy", default="trees")
    p.add_argument("--cut", default="h0:eth0", help="HOST:PORT of the cable to cut")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--every", type=int, default=5, help="checkpoint every N iterations")
    p.add_argument("--cut-after", type=int, default=10,
                   help="cut once the checkpoint after this many iterations exists")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.cut_after % args.every:
        p.error("--cut-after must be a multiple of --every (a checkpoint is written then)")

    tmp = Path(tempfile.mkdtemp(prefix="heal-bench-"))
    os.environ["TOPOCTL_LAB_DIR"] = str(tmp / "labs")
    name = f"hb{os.getpid() % 10**6}"
    job_doc = yaml.safe_load(Path(args.job).read_text()) | {"strategies": [args.strategy]}
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(job_doc))
    plan = tmp / "plan.yaml"
    if args.strategy in ("trees", "topoopt"):  # the tree runtime's CPU model (cached)
        subprocess.run([sys.executable, "-m", "topotrain.collectives.calibrate"], check=True,
                       capture_output=True)
    # as the lab emulates the cables (no latency without sch_netem), like the re-plan on a lab
    topoctl("plan", args.cluster, job, "--as-lab", "-o", plan)
    topoctl("lab", "up", args.cluster, "--name", name, "--no-ssh")
    runs = []
    try:
        from topoctl.lab.lab import Lab, set_port

        lab = Lab.load(name)
        for i in range(args.runs):
            topoctl("apply", plan, "--lab", name)
            r = one_run(lab, plan, job, args, tmp)
            runs.append(r)
            h = r["heal"]
            print(f"run {i + 1}: load {r['load']}; cut {h['cable']}: "
                  + ", ".join(f"{s} {r[s]:.2f} s" for s in STEPS)
                  + f"; resumed after {h['resumed_from']}; s/it predicted->measured before "
                  f"{h['predicted_before']:.3f}->{h['measured_before']:.3f}, after "
                  f"{h['predicted_after']:.3f}->{h['measured_after']:.3f}; synchronous "
                  f"{r['synchronous']}", flush=True)
            set_port(lab, args.cut, True)  # plug it back in for the next run
    finally:
        topoctl("lab", "down", "--lab", name, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    med = {s: statistics.median(r[s] for r in runs) for s in STEPS}
    for key in ("predicted_before", "measured_before", "predicted_after", "measured_after"):
        med[key] = statistics.median(r["heal"][key] for r in runs)
    print(f"median of {len(runs)}: " + ", ".join(f"{s} {med[s]:.2f} s" for s in STEPS)
          + f"; before {med['predicted_before']:.3f} -> {med['measured_before']:.3f} s/it, "
          f"after {med['predicted_after']:.3f} -> {med['measured_after']:.3f} s/it")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs,
                                               "median": med}, indent=1))
    return 0 if all(r["synchronous"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
