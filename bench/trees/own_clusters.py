"""Tree AllReduce on clusters of our own (issue 16), through the user's command-line path only:
for every generated cluster file (`bench.trees.clusters`, seeded, unlike the examples)

    topoctl plan CLUSTER JOB -o plan.yaml --as-lab --retime
                                                 (`strategies: [trees]`, batch B x hosts)
    topoctl lab up CLUSTER --name LAB
    topoctl apply plan.yaml --lab LAB
    topoctl run plan.yaml --lab LAB --iterations N --json
    topoctl lab down --lab LAB                   (always, also on failure or interrupt)

and report the predicted and measured iteration (`topoctl run`'s figure: median over the
iterations after its warm-up of the ranks' mean), the prediction error, the AllReduce
optimum (the plan's packed-tree LP optimum, `job.collective.schedule.metadata.
optimum_bytes_per_s`, applied to the gradient bytes, as `bench/demo/run.py` does) and optimum /
measured iteration (target >= 80%), with the load average at each start. Root only.
``--as-lab`` plans the cables the lab really builds (no latency where the kernel has no
sch_netem), ``--retime`` times the ranks' ops now: both are what a user comparing a lab run
with its prediction should pass.

    .venv/bin/python -m bench.trees.own_clusters [--suite full|small] [--only ring6 ...]
        [--iterations 8] [--seed 16] [--job plans/mlp-job.yaml] [--batch 48] [--out DIR]
        [--json]

Each cluster's files (cluster.yaml, job.yaml, plan.yaml, run.json) are kept in
``--out``/NAME (default ``bench/results/trees-own-clusters-DATE``), with results.json and
results.md next to them, so a reader can redo any line with the same commands.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import BIN, ROOT
from bench.trees import clusters as own_clusters
from topoagent.cliutil import ArgumentParser

TARGET = 0.80  # whole iteration / AllReduce optimum


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def topoctl(*args: object, env: dict, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run `topoctl ARGS` (this venv's), output captured."""
    return subprocess.run([str(BIN / "topoctl"), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def optimum_seconds(plan: dict) -> float | None:
    """Seconds of the fastest AllReduce of the job's gradients on this fabric: the packed
    trees' LP optimum (bytes/s) applied to the gradient bytes; None if the plan has none."""
    sched = plan["job"].get("collective", {}).get("schedule")
    rate = sched.get("metadata", {}).get("optimum_bytes_per_s") if isinstance(sched, dict) \
        else None
    return plan["metadata"]["model"]["parameters_bytes"] / float(rate) if rate else None


def lab_down(lab: str, env: dict) -> None:
    """`topoctl lab down` of `lab`, with Ctrl-C and SIGTERM ignored meanwhile (by it too: an
    ignored signal stays ignored across exec), so a second interrupt cannot cut it short."""
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        down = topoctl("lab", "down", "--lab", lab, env=env, timeout=300)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    if down.returncode:
        log(f"lab down {lab}: {(down.stdout + down.stderr).strip()}")


def measure(name: str, cluster: dict, job: dict, lab: str, iterations: int, out: Path,
            env: dict) -> dict:
    """One cluster through plan, lab up, apply, run, lab down; the figures (or the failure)."""
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    (d / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    row: dict = {"cluster": name, "description": cluster["description"],
                 "hosts": len(cluster["hosts"]), "cables": len(cluster["fabric"]["links"]),
                 "lab": lab, "iterations": iterations, "loadavg_start": loadavg()}
    t0 = time.perf_counter()
    # --as-lab: predicted for the cables the lab builds (no latency without sch_netem), so the
    # prediction is checked against what was run, not against cables nobody emulated
    r = topoctl("plan", d / "cluster.yaml", d / "job.yaml", "-o", d / "plan.yaml", "--as-lab",
                "--retime", env=env)
    if r.returncode:
        return row | {"error": f"plan: {r.stderr.strip()[-2000:]}"}
    row["plan_s"] = round(time.perf_counter() - t0, 2)
    plan = yaml.safe_load((d / "plan.yaml").read_text())
    meta = plan["metadata"]
    sched = plan["job"]["collective"].get("schedule") or {}
    row |= {"strategy": meta["strategy"], "trees": len(sched.get("trees", [])),
            "gradient_bytes": meta["model"]["parameters_bytes"],
            "predicted_s": meta["prediction"]["iteration_time"],
            "optimum_s": optimum_seconds(plan)}
    try:  # from `lab up` on: an interrupt during it still takes down what it built
        r = topoctl("lab", "up", d / "cluster.yaml", "--name", lab, env=env)
        if r.returncode:
            return row | {"error": f"lab up: {(r.stdout + r.stderr).strip()[-2000:]}"}
        r = topoctl("apply", d / "plan.yaml", "--lab", lab, env=env)
        if r.returncode:  # 0: applied (changes made or not)
            return row | {"error": f"apply: {(r.stdout + r.stderr).strip()[-2000:]}"}
        row["loadavg_run"] = loadavg()
        r = topoctl("run", d / "plan.yaml", "--lab", lab, "--iterations", iterations, "--json",
                    "--timeout", 900, env=env)
        (d / "run.json").write_text(r.stdout)
        try:
            result = json.loads(r.stdout)
        except ValueError:
            return row | {"error": f"run: exit {r.returncode}: {r.stderr.strip()[-2000:]}"}
        if r.returncode or not result.get("iteration_time"):
            return row | {"error": f"run: exit {r.returncode}: {result.get('failure')}"}
    finally:
        lab_down(lab, env)
    measured = result["iteration_time"]
    row |= {"measured_s": measured, "synchronous": result["synchronous"],
            "run_s": result["seconds"],
            "error_pct": 100 * (row["predicted_s"] - measured) / measured}
    if row["optimum_s"]:
        row["optimum_over_measured"] = row["optimum_s"] / measured
        row["meets_target"] = row["optimum_over_measured"] >= TARGET
    return row


def wire_gbit_s(row: dict) -> str:
    """What the lab's cable emulation carries during an AllReduce at the optimum: 2 (n-1) M
    bytes over all cables (each rank sends and receives about 2 M (n-1) / n) in the optimum's
    time, in Gbit/s (this machine's emulation carried about 5.3 Gbit/s with iperf3 alone)."""
    if not row.get("optimum_s"):
        return "n/a"
    bits = 8 * 2 * (row["hosts"] - 1) * row["gradient_bytes"]
    return f"{bits / row['optimum_s'] / 1e9:.1f} Gbit/s"


def table(rows: list[dict]) -> str:
    """The markdown table of the rows."""
    lines = ["| cluster | hosts / cables | trees | predicted s/it | measured s/it | error | "
             "AllReduce optimum | optimum / measured (target >= 80%) | cables carry at the "
             "optimum | load average at start |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        load = " / ".join(f"{x:.1f}" for x in r["loadavg_start"])
        if "error" in r:
            lines.append(f"| {r['cluster']} | {r['hosts']} / {r['cables']} | failed: "
                         f"{r['error'].splitlines()[-1][:80]} | | | | | | | {load} |")
            continue
        ratio = r.get("optimum_over_measured")
        lines.append(
            f"| {r['cluster']} ({r['description']}) | {r['hosts']} / {r['cables']} | "
            f"{r['trees']} | {r['predicted_s']:.3f} | {r['measured_s']:.3f} | "
            f"{r['error_pct']:+.1f}% | {r['optimum_s']:.3f} s | "
            + (f"{100 * ratio:.1f}%" if ratio else "n/a") + f" | {wire_gbit_s(r)} | {load} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run every chosen cluster, print JSON or the table."""
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default="full", choices=["full", "small"])
    ap.add_argument("--only", nargs="+", help="these clusters of the suite only")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=8, choices=range(1, 1001),
                    metavar="N", help="iterations per cluster (8)")
    ap.add_argument("--job", default=str(ROOT / "plans" / "mlp-job.yaml"))
    ap.add_argument("--batch", type=int, default=48, choices=range(1, 100001), metavar="B",
                    help="samples per rank: batch.global = B x hosts (48, as the demo job's "
                    "384 on 8 hosts)")
    ap.add_argument("--out", help="results directory (default bench/results/"
                    "trees-own-clusters-DATE)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("trees_own_clusters: needs root (network namespaces)", file=sys.stderr)
        return 1
    clusters = own_clusters.suite(args.suite, args.seed)
    unknown = sorted(set(args.only or []) - set(clusters))
    if unknown:
        print(f"--only: no cluster {', '.join(unknown)} in suite {args.suite} "
              f"({', '.join(clusters)})", file=sys.stderr)
        return 1
    try:
        job = yaml.safe_load(Path(args.job).read_text())
    except (OSError, yaml.YAMLError) as e:
        print(f"trees_own_clusters: {args.job}: {e}", file=sys.stderr)
        return 1
    if not isinstance(job, dict) or job.get("kind") != "Job":
        print(f"trees_own_clusters: {args.job}: not a job file (kind: Job)", file=sys.stderr)
        return 1
    job["strategies"] = ["trees"]
    day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    out = Path(args.out or ROOT / "bench" / "results" / f"trees-own-clusters-{day}")
    out.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C, so the `finally` of the running cluster takes its lab down
    signal.signal(signal.SIGTERM, _interrupted)
    # (no separate calibration step: every cluster's `plan --retime` measures the runtime
    # calibration again before it times the ops)
    rows = []
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="tpt-own-") as labs:
        env = os.environ | {"TOPOCTL_LAB_DIR": labs}
        for i, (name, cluster) in enumerate(clusters.items()):
            if args.only and name not in args.only:
                continue
            lab = f"ow{i}p{os.getpid() % 100000}"
            log(f"{name}: plan, lab up {lab}, apply, run {args.iterations} iterations")
            try:
                n = len(cluster["hosts"])  # the batch must split evenly over the ranks
                job_n = job | {"batch": (job.get("batch") or {}) | {"global": args.batch * n}}
                rows.append(measure(name, cluster, job_n, lab, args.iterations, out, env))
            except KeyboardInterrupt:  # its lab is down already (measure's `finally`)
                log(f"{name}: interrupted; lab {lab} removed")
                return 130
            r = rows[-1]
            log(f"{name}: " + (r["error"].splitlines()[-1] if "error" in r else
                               f"measured {r['measured_s']:.3f} s/it, predicted "
                               f"{r['predicted_s']:.3f}, optimum {r['optimum_s']:.3f}"))
    doc = {"started": started, "seed": args.seed, "suite": args.suite,
           "job": str(args.job), "target": TARGET, "cpu": _cpu(), "rows": rows}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = table(rows)
    (out / "results.md").write_text(f"{started}, {doc['cpu']}\n\n{text}\n")
    print(json.dumps(doc, indent=1) if args.json else text)
    return 1 if any("error" in r for r in rows) else 0


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} x {os.cpu_count()}"
    return f"{os.cpu_count()} cpus"


if __name__ == "__main__":
    sys.exit(main())
