"""Predicted vs measured iteration time in the lab (root): plan a job on a cluster, build the
cluster as a lab, apply every rendered HostState with `topo-agent`, launch the plan's ranks with
`topo-agent launch` (topotrain.train: DDP over gloo on the training addresses), and compare the
job's measured period as `topoctl run` reports it (after its warm-up iterations, the ranks'
mean, median over iterations: `RunResult.iteration_time`) with the plan's prediction.

    python -m bench.planner.lab_check plans/hetero8-cluster.yaml plans/mlp-job.yaml [iters]
        [--strategies baseline trees ...] [--plan plan.yaml] [--min-seconds 6] [--keep DIR]
        [--repeats 3]

With ``--strategies`` (default: the job file's list, each planned alone) every strategy is
planned, applied and measured in turn on the same lab, one line each; trees plans get the
runtime's CPU calibration first (``python -m topotrain.collectives.calibrate``, cached).
``--plan`` measures a given plan of the cluster (e.g. a split the planner did not choose)
instead of planning. The lab is cabled as each plan's `fabric` says (`topoctl lab up --plan`),
so a strategy that re-cables (topoopt) is measured on its own cables. ``--repeats N`` checks
every strategy N times, round by round (each round plans and measures every strategy once, so
the machine's drift spreads over all of them), and ends with a table of the medians: on the
2-core AMD VM the same trees plan measured 0.568-0.657 s per iteration within five minutes,
more than the 5% a single run is judged by. Uses only the
command-line tools; the lab gets its own name (``$BENCH_LAB_PREFIX``, default ``pc``, then
the process id) and is removed at the end. ``--keep DIR`` saves
each check's plan and every rank's output (its JSON events) in DIR/CLUSTER-STRATEGY/.

Each check also prints the machine's speed before the plan and after the run (a one-thread
matmul probe): on a shared VM the same one-rank plan measured 0.161 and 0.182 s per iteration
minutes apart, so an error of that size is the machine's drift, not the model's. SFB plans
also get each rank's seconds in its gathers and rebuilds (the `iter` event's ``sfb_seconds``)
and how far apart the ranks end an iteration: they leave the gathers one by one."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from bench.common import BIN, MIN_TIMED_SECONDS
from topoagent.cliutil import ArgumentParser
from topoctl.lab import lab as labmod
from topoctl.rollout.run import WARMUP, RankStats, RunResult, iterations_for


def speed_probe(seconds: float = 2.0) -> float:
    """Median thread-CPU seconds of one 96 x 1024 by 1024 x 1024 float32 matmul (the lab MLP's
    layer at its micro-batch) over `seconds`: the machine's speed now."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, w = torch.randn(96, 1024), torch.randn(1024, 1024)
    times: list[float] = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            t0 = time.thread_time()
            for _ in range(10):
                a @ w
            times.append((time.thread_time() - t0) / 10)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)


class CpuSampler:
    """Machine-wide CPU use from /proc/stat, sampled every `period` seconds in a thread: what the
    ranks use plus what they do not see (the cables' emulation in softirq, forwarding hosts)."""

    FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

    def __init__(self, period: float = 0.1):
        self.period = period
        self.samples: list[tuple[float, list[int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _read() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:9]]

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), self._read()))
            self._stop.wait(self.period)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def share(self, t0: float, t1: float) -> dict[str, float] | None:
        """Cores busy between the samples nearest `t0` and `t1` (all, and softirq alone)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return None
        (a, x), (b, y) = inside[0], inside[-1]
        d = [j - i for i, j in zip(x, y, strict=True)]
        total = sum(d) or 1
        cores = os.cpu_count() or 1
        busy = total - d[3] - d[4]
        return {"busy": cores * busy / total, "softirq": cores * d[6] / total,
                "system": cores * d[2] / total, "seconds": b - a}


def main(cluster_file: str, job_file: str, iterations: int = 5,
         strategies: list[str] | None = None, plan_file: str | None = None,
         min_seconds: float = MIN_TIMED_SECONDS, keep: Path | None = None, repeats: int = 1) -> int:
    job = yaml.safe_load(Path(job_file).read_text())
    given = yaml.safe_load(Path(plan_file).read_text()) if plan_file else None
    if given is not None:  # measure this plan (made for this cluster) instead of planning
        strategies = [given["metadata"]["strategy"]]
    strategies = strategies or list(job.get("strategies") or ["baseline"])
    if given is None and {"trees", "topoopt"} & set(strategies):  # both run the tree runtime
        r = run(sys.executable, "-m", "topotrain.collectives.calibrate")
        if r.returncode:
            print(r.stderr, file=sys.stderr)
            return 1
    rows: list[dict] = []
    for k in range(repeats):
        for s in strategies:
            row = check(cluster_file, {**job, "strategies": [s]}, iterations, given,
                        min_seconds, keep, f"r{k + 1}" if repeats > 1 else "")
            if row is None:
                return 1
            rows.append(row)
    if repeats > 1:
        print()
        print("\n".join(median_table(rows)))
    return 0


def median_table(rows: list[dict]) -> list[str]:
    """Markdown table of `check` rows, one line per strategy (in first-seen order): median
    prediction and measurement over its runs (ranges), the error of the two medians and each
    run's own error."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["strategy"], []).append(r)
    out = ["| strategy | runs | predicted s/it, median (range) | measured s/it, median (range) "
           "| error of the medians | each run's error |", "|---|---|---|---|---|---|"]
    for s, rs in by.items():
        pred = [r["predicted"] for r in rs]
        meas = [r["measured"] for r in rs]
        p, m = statistics.median(pred), statistics.median(meas)
        each = ", ".join(f"{r['error_pct']:+.1f}%" for r in rs)
        out.append(f"| {s} | {len(rs)} | {p:.3f} ({min(pred):.3f}-{max(pred):.3f}) | "
                   f"{m:.3f} ({min(meas):.3f}-{max(meas):.3f}) | {100 * (p - m) / m:+.1f}% | "
                   f"{each} |")
    return out


def check(cluster_file: str, job: dict, iterations: int, given: dict | None = None,
          min_seconds: float = MIN_TIMED_SECONDS, keep: Path | None = None, run_label: str = ""
          ) -> dict | None:
    """Plan (or take `given`), build the lab, apply, train and print the comparison; the row
    (strategy, predicted, measured, error_pct) or None on failure
    (reported on stderr). `run_label` tells repeated runs' kept files apart."""
    name = f"{os.environ.get('BENCH_LAB_PREFIX', 'pc')[:4]}{os.getpid() % 10000}"
    tmp = Path(tempfile.mkdtemp(prefix="planner-lab-"))
    cluster = yaml.safe_load(Path(cluster_file).read_text())
    label = cluster["name"]
    cluster["name"] = name
    job["launch"] = (job.get("launch") or {}) | {"iterations": iterations}
    (tmp / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    speed_before = speed_probe()
    if given is None:
        # op times of now (this VM's speed drifts); predictions for the cables the lab
        # really has (`--as-lab`: no latency or loss without sch_netem)
        r = run(BIN / "topoctl", "plan", "--retime", "--as-lab", tmp / "cluster.yaml",
                tmp / "job.yaml", "-o", tmp / "plan.yaml")
        if r.returncode:
            print(r.stderr, file=sys.stderr)
            return None
        for line in r.stderr.splitlines():
            if "sch_netem" in line:
                print(f"  ({line.removeprefix('topoctl: ')})")
    else:
        (tmp / "plan.yaml").write_text(yaml.safe_dump(given, sort_keys=False))
    plan = yaml.safe_load((tmp / "plan.yaml").read_text())
    # the timed iterations cover at least `min_seconds` of predicted time
    plan["job"]["iterations"] = iterations_for(plan["metadata"]["prediction"]["iteration_time"],
                                               iterations, min_seconds)
    labs = tmp / "labs"
    # cabled as the plan says: a strategy that re-cables (topoopt) is measured on its own
    # cables, not on the cluster file's (for the others the two are the same)
    r = run(BIN / "topoctl", "lab", "up", tmp / "cluster.yaml", "--name", name, "--no-ssh",
            "--plan", tmp / "plan.yaml", "--state-dir", labs)
    if r.returncode:
        print(r.stdout, r.stderr, file=sys.stderr)
        return None
    try:
        for h, st in plan["hosts"].items():
            (tmp / f"{h}.yaml").write_text(yaml.safe_dump(st, sort_keys=False))
            r = run(BIN / "topo-agent", "--netns", f"tp-{name}-h-{h}", "--state-dir",
                    tmp / "agent" / h, "apply", tmp / f"{h}.yaml")
            if r.returncode:  # 0: applied (changes made or not)
                print(f"apply {h}: {r.stdout}{r.stderr}", file=sys.stderr)
                return None
        (tmp / "job.json").write_text(json.dumps(plan["job"]))
        # each host's launcher (and so its ranks) in the host's CPU group, as the lab
        # transport starts it: hosts with a `speed` run at their quota
        lab = labmod.Lab.load(name, labs)
        procs = {h: subprocess.Popen([*lab.join_prefix(h), str(BIN / "topo-agent"), "--netns",
                                      f"tp-{name}-h-{h}", "launch", "--host", h, "--timeout",
                                      "900", str(tmp / "job.json")], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
                 for h in plan["job"]["processes"]}
        seconds: dict[str, list[float]] = {}  # host -> its rank's seconds per iteration
        window = [math.inf, -math.inf]  # wall clock of the measured iterations, all ranks
        cpu: dict[str, list[float]] = {}  # host -> its rank's CPU seconds per iteration
        phases: dict = {}  # pipeline ranks: stage -> per-iteration phase seconds
        phases_cpu: dict = {}  # pipeline ranks: host -> per-iteration phase CPU seconds
        sfb_sync: dict[str, list[float]] = {}  # SFB plans: host -> seconds in `SfbLayers.sync`
        ends: dict[int, list[float]] = {}  # iteration -> the ranks' end times (wall clock)
        buckets: dict[str, list] = {}  # tree plans: host -> per-iteration bucket timings
        with CpuSampler() as sampler:
            outs = {h: p.communicate()[0] for h, p in procs.items()}
        if keep is not None:
            kept = keep / "-".join(x for x in (label, plan['metadata']['strategy'], run_label)
                                   if x)
            kept.mkdir(parents=True, exist_ok=True)
            shutil.copy(tmp / "plan.yaml", kept / "plan.yaml")
            for h, out in outs.items():
                (kept / f"{h}.log").write_text(out)
        for host, p in procs.items():
            out = outs[host]
            for line in out.splitlines():
                _, _, body = line.partition("] ")
                ev = json.loads(body) if body.startswith("{") else {}
                if ev.get("event") != "iter":
                    continue
                # one series per rank (a host may run several)
                h = host if len(plan["job"]["processes"][host]) == 1 else \
                    f"{host}/{ev['rank']}"
                seconds.setdefault(h, []).append(ev["seconds"])
                if "allreduce" in ev:
                    buckets.setdefault(h, []).append(ev["allreduce"])
                if ev["iter"] < 1:
                    continue
                if "end" in ev:
                    window[0] = min(window[0], ev["end"] - ev["seconds"])
                    window[1] = max(window[1], ev["end"])
                if "cpu_seconds" in ev:
                    cpu.setdefault(h, []).append(ev["cpu_seconds"])
                if ev.get("phases"):
                    phases.setdefault(ev.get("stage"), []).append(ev["phases"])
                if ev.get("phases_cpu"):
                    phases_cpu.setdefault(h, []).append(ev["phases_cpu"])
                if "sfb_seconds" in ev:
                    sfb_sync.setdefault(h, []).append(ev["sfb_seconds"])
                    ends.setdefault(ev["iter"], []).append(ev["end"])
            if p.returncode:
                print(f"launch {host} failed:\n{out[-2000:]}", file=sys.stderr)
                return None
    finally:
        run(BIN / "topoctl", "lab", "down", "--lab", name, "--state-dir", labs)
        shutil.rmtree(tmp, ignore_errors=True)
    speed_after = speed_probe()
    predicted = plan["metadata"]["prediction"]["iteration_time"]
    # the job's period as `topoctl run` reports it (the ranks' mean, median over iterations)
    measured = RunResult(0, {i: RankStats(h, iterations=s) for i, (h, s) in
                             enumerate(sorted(seconds.items()))}, 0.0).iteration_time
    timed = max(0, min(len(s) for s in seconds.values()) - WARMUP)
    error_pct = 100 * (predicted - measured) / measured
    print(f"{label}/{plan['metadata']['job']} [{plan['metadata']['strategy']}]: "
          f"predicted {predicted:.3f} s, "
          f"measured {measured:.3f} s (ranks' mean, median of {timed} iterations), error "
          f"{error_pct:+.1f} %")
    if buckets:  # the tree runtime's own time per bucket, against its prediction
        from topoctl.rollout.run import allreduce_summary, predicted_buckets

        ranks = {i: RankStats(h, allreduce=b) for i, (h, b) in enumerate(sorted(buckets.items()))}
        rows = RunResult(0, ranks, 0.0).allreduce_seconds
        if rows:
            print("  " + allreduce_summary(rows, predicted_buckets(plan)))
    if cpu:  # how CPU-bound the run was: the ranks' own CPU against the machine's cores
        per_rank = sum(statistics.median(v) for v in cpu.values())
        cores = os.cpu_count() or 1
        print(f"  ranks' CPU per iteration: {per_rank:.3f} core-s in all "
              f"({per_rank / len(cpu) * 1e3:.1f} ms per rank), "
              f"{100 * per_rank / (cores * measured):.0f}% of the {cores} cores over the "
              "measured iteration (cable emulation outside the ranks not counted)")
    machine = sampler.share(*window) if window[0] < window[1] else None
    if machine:
        print(f"  machine during the measured iterations ({machine['seconds']:.1f} s): "
              f"{machine['busy']:.2f} of {os.cpu_count()} cores busy, softirq "
              f"{machine['softirq']:.2f}, system {machine['system']:.2f}")
    print(f"  machine speed (one-thread matmul probe): {speed_before * 1e3:.2f} ms before the "
          f"plan, {speed_after * 1e3:.2f} ms after the run (after / before "
          f"{speed_after / speed_before:.2f})")
    for st, ph in sorted(phases.items()):
        med = {k: statistics.median(x[k] for x in ph) for k in ph[0]}
        print(f"  stage {st}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items()))
    if phases_cpu:  # each rank's own CPU per phase (its threads, kernel time included)
        print("  ranks' CPU per iteration, median: " + "; ".join(
            f"{h} " + ", ".join(f"{k} {statistics.median(x[k] for x in ph) * 1e3:.1f}"
                                for k in ph[0]) + " ms"
            for h, ph in sorted(phases_cpu.items())))
    if sfb_sync:  # SFB: each rank's gathers and rebuilds; ranks leave them one by one
        spread = statistics.median(max(e) - min(e) for e in ends.values())
        print("  ranks' SFB sync (gathers and rebuilds) per iteration, median: " + ", ".join(
            f"{h} {statistics.median(v):.3f} s" for h, v in sorted(sfb_sync.items()))
            + f"; the ranks end an iteration {spread * 1e3:.0f} ms apart (median)")
    sys.stdout.flush()  # a long --repeats run shows each check as it ends
    return {"strategy": plan["metadata"]["strategy"], "predicted": predicted,
            "measured": measured, "error_pct": error_pct}


def cli(argv: list[str] | None = None) -> int:
    """Parse the command line (usage errors exit 1, README "Exit codes") and run `main`."""
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cluster", help="cluster file")
    ap.add_argument("job", help="job file")
    ap.add_argument("iterations", nargs="?", type=int, default=5,
                    help="iterations, at least (5; see --min-seconds)")
    ap.add_argument("--strategies", nargs="+", help="strategies to check (default: all)")
    ap.add_argument("--plan", help="measure this plan of the cluster instead of planning")
    ap.add_argument("--min-seconds", type=float, default=MIN_TIMED_SECONDS,
                    help="more iterations when the timed ones would cover less predicted time "
                         f"({MIN_TIMED_SECONDS:g})")
    ap.add_argument("--keep", type=Path, help="save each check's plan and rank outputs here")
    ap.add_argument("--repeats", type=int, default=1,
                    help="check every strategy this many times, round by round, and end with "
                         "a table of the medians (1)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    return main(args.cluster, args.job, args.iterations, args.strategies, args.plan,
                args.min_seconds, args.keep, args.repeats)


if __name__ == "__main__":
    sys.exit(cli())
