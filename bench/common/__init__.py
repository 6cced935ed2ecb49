"""Shared by the benchmark programs: where the checkout's files are, the benchmarks' defaults,
synthetic cluster and job files for the planner benchmarks (plain cluster-file data) and the
machine's CPU readings and process clean-up of the lab benchmarks. Light imports only (the tree
runtime's cost model is `bench.common.trees`)."""

from __future__ import annotations

import sys
from math import gcd
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout holding bench/ and plans/
PLANS = ROOT / "plans"
BIN = Path(sys.executable).parent  # this interpreter's venv: topoctl, topo-agent

# predicted seconds the timed iterations of a benchmark run cover at least (bench/demo/run.py,
# bench/planner/lab_check.py; `topoctl.rollout.run.iterations_for`): a fast strategy's median
# is not left to a few samples, nor half made of a tree plan's first, still settling iterations
# (topoopt on hetero8: 0.80, 0.79, 0.77, then 0.72, 0.70, 0.73 s: with 3 s of timed iterations,
# -8.8% against the steady prediction)
MIN_TIMED_SECONDS = 6.0
# `make demo` (bench/demo/run.py): iterations per row at least, by default and with --careful. 4 is
# what the MIN_TIMED_SECONDS rule asks of the baseline rows anyway (2 timed iterations, 9 s; they
# agreed within 0.2% after the warm-up: 4.481-4.489 s); every faster row gets more from it
DEMO_ITERATIONS = 4
DEMO_ITERATIONS_CAREFUL = 8
CAREFUL_RUNS = 3  # `make demo`'s --careful: runs whose medians are the table (bench/demo_median)


def switched(n: int, speed: str = "100gbit", gpu: str = "A100") -> dict:
    """A cluster of `n` one-NIC hosts on one switch."""
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"switch{n}",
            "defaults": {"nic_speed": speed, "gpus": {"count": 1, "type": gpu}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}]} for i in range(n)],
            "fabric": {"kind": "switched", "switches": [{"name": "sw0"}]}}


def direct(n: int, degree: int = 4, speed: str = "100gbit", gpu: str = "A100") -> dict:
    """A TotientPerms-style direct fabric: degree/2 rings with strides coprime to n."""
    strides = [p for p in range(1, n) if gcd(p, n) == 1][: degree // 2 * 3: 3][: degree // 2]
    hosts = [{"name": f"h{i}", "nics": [{"name": f"eth{k}"} for k in range(degree)]}
             for i in range(n)]
    links = []
    for r, p in enumerate(strides):
        for i in range(n):
            links.append({"a": f"h{i}:eth{2 * r}", "b": f"h{(i + p) % n}:eth{2 * r + 1}"})
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"direct{n}",
            "defaults": {"nic_speed": speed, "gpus": {"count": 1, "type": gpu}},
            "hosts": hosts, "fabric": {"kind": "direct", "links": links}}


def job(model: str, params: dict, batch: int, bucket: str = "25MB", dtype: str = "float16",
        method: str = "roofline") -> dict:
    """A job file of catalog model `model` at global batch `batch`."""
    return {"apiVersion": "topoctl/v1", "kind": "Job", "name": "bench",
            "model": {"catalog": model, "params": params}, "batch": {"global": batch},
            "dtype": dtype, "sync": {"bucket": bucket}, "cost": {"method": method}}


def machine_cpu() -> tuple[float, float]:
    """Busy and total jiffies of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        vals = [float(v) for v in f.readline().split()[1:]]
    return sum(vals) - vals[3] - vals[4], sum(vals)


def busy_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Share of the machine's cores busy between two :func:`machine_cpu` readings."""
    return (after[0] - before[0]) / max(after[1] - before[1], 1e-9)


def stop_all(procs: list) -> None:
    """Kill and reap every process of `procs` still running (benchmark clean-up)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
