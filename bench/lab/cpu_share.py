"""Benchmark: a lab rank's step time follows its host's CPU share. Target: within 10%.

Usage (root): .venv/bin/python -m bench.lab.cpu_share [--speeds 1,0.5,0.25] [--runs 3]
[--window 2]

A lab of one host per speed (`hosts[].speed`; the lab gives host h a CPU quota of
s_h * unit cores, unit = min(1, 1/max s, cores/sum s): docs/lab.md). In every host one
single-threaded process (started as the lab starts every process of a host: in its namespace
and CPU group) runs the same CPU-bound training step (an MLP 784-512-512-10, batch 64, SGD,
one torch thread) in timed windows of `--window` seconds: first all hosts at once (as
data-parallel ranks compute), then one host at a time. A window's step time is its wall time
over the steps it ran. Per host and mode the median of `--runs` windows; the ratio to the
fastest host's is compared with the quota ratio (expected step time ratio = q_fast / q_h).
Prints a Markdown table, the load average before and after and whether the QUIET window of
the shared machine was open.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from topoctl.lab import cpu
from topoctl.lab import lab as labmod
from topoctl.spec.cluster_load import parse_cluster

QUIET = Path("/work/shared/helpers/QUIET")
TARGET = 0.10  # within 10% of the quota ratio

# one rank: warm up, say ready, wait for the start time on stdin, then run the windows of the
# schedule it gets (a list of start times) and print the step time of each
WORKER = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                        torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.step()
for _ in range(20):
    step()
print("ready", flush=True)
plan = json.loads(sys.stdin.readline())
window, out = plan["window"], []
for start in plan["starts"]:
    while time.time() < start:
        time.sleep(min(0.02, max(0.0, start - time.time())))
    n, c0, t0 = 0, time.process_time(), time.perf_counter()
    while True:
        step()
        n += 1
        now = time.perf_counter()
        if now - t0 >= window:
            break
    out.append({"step": (now - t0) / n, "cpu": (time.process_time() - c0) / (now - t0),
                "steps": n})
print(json.dumps(out), flush=True)
"""


def steal() -> float:
    """Seconds of steal time so far over all CPUs (/proc/stat, USER_HZ ticks)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def cluster(speeds: list[float]) -> dict:
    """One host per speed on a ring of 100 Mbit/s cables (the cables do not matter here)."""
    n = len(speeds)
    hosts = [{"name": f"h{i}", "speed": s, "nics": [{"name": "eth0"}, {"name": "eth1"}]}
             for i, s in enumerate(speeds)]
    links = [{"a": f"h{i}:eth0", "b": f"h{(i + 1) % n}:eth1"} for i in range(n)] if n > 2 \
        else [{"a": "h0:eth0", "b": "h1:eth1"}]
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "cpushare",
            "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "cpu"}},
            "hosts": hosts, "fabric": {"kind": "direct", "mtu": 9000, "links": links}}


def schedule(n: int, runs: int, window: float, t0: float, gap: float = 0.5) -> list[list[float]]:
    """Window start times per host: `runs` windows all at once, then `runs` rounds of one
    host at a time."""
    slot = window + gap
    starts: list[list[float]] = [[t0 + r * slot for r in range(runs)] for _ in range(n)]
    base = t0 + runs * slot
    for r in range(runs):
        for i in range(n):
            starts[i].append(base + (r * n + i) * slot)
    return starts


def run(lab: labmod.Lab, hosts: list[str], runs: int, window: float) -> dict[str, list[dict]]:
    """Start one worker per host, release them together, return each one's windows."""
    procs = {h: subprocess.Popen(lab.netns_argv(h, [sys.executable, "-c", WORKER]),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for h in hosts}
    try:
        for h, p in procs.items():
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"{h}: worker failed to start ({line!r})")
        starts = schedule(len(hosts), runs, window, time.time() + 1.0)
        for (_, p), s in zip(procs.items(), starts, strict=True):
            p.stdin.write(json.dumps({"window": window, "starts": s}) + "\n")
            p.stdin.flush()
        return {h: json.loads(p.stdout.readline()) for h, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


def table(speeds: list[float], quotas: dict[str, float], res: dict[str, list[dict]],
          runs: int) -> tuple[list[str], bool]:
    """Markdown rows (host, speed, quota, mode, median step, measured and expected ratio,
    error) and whether every ratio is within the target."""
    hosts = list(quotas)
    fast = max(hosts, key=lambda h: quotas[h])
    rows = [f"| host | speed | quota (cores) | mode | step (median of {runs}) | CPU used | "
            f"CPU per step | ratio to {fast} | expected | error |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    ok = True
    for mode, part in (("all at once", slice(0, runs)), ("alone", slice(runs, 2 * runs))):
        med = {h: statistics.median(w["step"] for w in res[h][part]) for h in hosts}
        used = {h: statistics.median(w["cpu"] for w in res[h][part]) for h in hosts}
        # CPU seconds a step took: the quota sets CPU used, the core's speed at that moment
        # (what else the machine runs, its SMT sibling, the hypervisor) sets this
        per = {h: statistics.median(w["cpu"] * w["step"] for w in res[h][part]) for h in hosts}
        for h, s in zip(hosts, speeds, strict=True):
            ratio, want = med[h] / med[fast], quotas[fast] / quotas[h]
            err = ratio / want - 1
            ok &= abs(err) <= TARGET
            rows.append(f"| {h} | {s:g} | {quotas[h]:.3g} | {mode} | {med[h] * 1e3:.1f} ms | "
                        f"{used[h]:.3f} | {per[h] * 1e3:.2f} ms | {ratio:.3f} | {want:.3f} | "
                        f"{err:+.1%} |")
    return rows, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--speeds", default="1,0.5,0.25", help="one host per speed")
    ap.add_argument("--runs", type=int, default=3, help="windows per host and mode (medians)")
    ap.add_argument("--window", type=float, default=2.0, help="seconds per timed window")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces, cgroups)", file=sys.stderr)
        return 2
    speeds = [float(s) for s in args.speeds.split(",")]
    c = parse_cluster(cluster(speeds))
    quotas = cpu.quotas({h.name: h.speed for h in c.hosts}, cpu.machine_cores())
    assert quotas is not None
    name = f"bc{os.getpid() % 100000}"
    load0, quiet0, steal0 = os.getloadavg(), not QUIET.exists(), steal()
    with tempfile.TemporaryDirectory() as root:
        lab = labmod.up(c, name, root, with_ssh=False)
        try:
            res = run(lab, [h.name for h in c.hosts], args.runs, args.window)
        finally:
            labmod.down(name, root)
    load1, quiet1, steal1 = os.getloadavg(), not QUIET.exists(), steal()
    rows, ok = table(speeds, quotas, res, args.runs)
    print(f"cgroup {cpu.detect().kind if cpu.detect() else '-'}, {cpu.machine_cores()} cores, "
          f"period {cpu.PERIOD_US} us; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"load average (1 min) before {load0[0]:.2f}, after {load1[0]:.2f}; QUIET file "
          f"{'absent' if quiet0 and quiet1 else 'present'} (absent: the lead is not measuring)")
    print(f"steal time (the hypervisor's share of this VM's CPUs) during the run: "
          f"{steal1 - steal0:.2f} s")
    print("\n".join(rows))
    print(f"target: every ratio within {TARGET:.0%} of the quota ratio: "
          f"{'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
