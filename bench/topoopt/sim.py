"""TopoOpt at scale, in the simulator: 128 servers with d ports of B each, catalog workloads
sized like the paper's, the `topoopt` strategy against switched and random fabrics of the same
per-server bandwidth (d x B):

- fat-tree:      ideal full bisection (every port on one non-blocking switch);
- fat-tree 2:1 / 4:1: leaves of 16 servers whose uplink to the spine is oversubscribed;
- expander:      a random d-regular direct-connect graph (seeded), shortest-path routing.

Baselines run the `baseline` strategy (data parallel, ring AllReduce in host order); topoopt
also searches data/model parallelism per op group (jobs with `parallelism.model: true`: DLRM,
BERT), with a shortened search here (`--mcmc`, `--rounds`); when it finds a hybrid, every
baseline fabric runs the faster of data parallelism and that same hybrid (`hybrid_time`).
Also times the planner (`topoopt` strategy, prepare excluded) at n = 128 and n = 1024
(targets 5 s and 60 s).

    python -m bench.topoopt.sim [--hosts 128] [--degrees 4,8] [--speeds 25gbit,100gbit]
        [--workloads dlrm,bert,candle_uno,vgg,resnet] [--planner-time 128,1024] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import networkx as nx
import yaml

from bench.common import ROOT

JOBS = {"dlrm": "dlrm-job.yaml", "bert": "bert-job.yaml", "candle_uno": "candle-uno-job.yaml",
        "vgg": "vgg16-job.yaml", "resnet": "resnet50-job.yaml"}
RACK = 16


def _hosts(n: int, d: int) -> list[dict]:
    return [{"name": f"h{i}", "nics": [{"name": f"eth{k}"} for k in range(d)]}
            for i in range(n)]


def cluster(kind: str, n: int, d: int, speed: str) -> dict:
    base = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"sim{n}",
            "defaults": {"nic_speed": speed, "gpus": {"count": 1, "type": "A100"}},
            "gpu_types": {"A100": {"peak_flops": 312e12, "memory_bandwidth": 1.555e12}},
            "hosts": _hosts(n, d)}
    if kind == "topoopt":
        return base | {"fabric": {"kind": "direct", "mtu": 9000, "links": []}}
    if kind == "expander":
        seed = 1
        while not nx.is_connected(g := nx.random_regular_graph(d, n, seed=seed)):
            seed += 1
        used = dict.fromkeys(range(n), 0)
        links = []
        for a, b in sorted(g.edges()):
            links.append({"a": f"h{a}:eth{used[a]}", "b": f"h{b}:eth{used[b]}"})
            used[a] += 1
            used[b] += 1
        return base | {"fabric": {"kind": "direct", "mtu": 9000, "links": links}}
    # a switched fabric of the same per-server bandwidth: one NIC of d x speed per server (d
    # NICs into one switch would be a bundle of parallel cables, of which one TCP connection
    # per peer uses one: `fabric.graph.lead_cable`)
    value, unit = re.fullmatch(r"(\d+)([a-z]+)", speed).groups()
    base = base | {"defaults": base["defaults"] | {"nic_speed": f"{int(value) * d}{unit}"},
                   "hosts": _hosts(n, 1)}
    if kind == "fat-tree":
        return base | {"fabric": {"kind": "switched", "mtu": 9000,
                                  "switches": [{"name": "core"}]}}
    over = {"fat-tree-2:1": 2, "fat-tree-4:1": 4}[kind]
    leaves = [{"name": f"leaf{r}", "uplink": "spine", "oversubscription": over}
              for r in range((n + RACK - 1) // RACK)]
    attach = [{"port": f"h{i}", "switch": f"leaf{i // RACK}"} for i in range(n)]
    return base | {"fabric": {"kind": "switched", "mtu": 9000,
                              "switches": leaves + [{"name": "spine"}], "attach": attach}}


def job(workload: str, strategy: str) -> dict:
    doc = yaml.safe_load((ROOT / "plans" / JOBS[workload]).read_text())
    return doc | {"strategies": [strategy]}


def run_case(n: int, d: int, speed: str, workload: str) -> dict:
    from topoctl.planner import evaluate, prepare
    from topoctl.spec.cluster_load import parse_cluster
    from topoctl.spec.job import parse_job

    out = {}
    mp_ops: list[str] = []
    for kind in ("topoopt", "fat-tree", "fat-tree-2:1", "fat-tree-4:1", "expander"):
        strategy = "topoopt" if kind == "topoopt" else "baseline"
        ctx = prepare(parse_cluster(cluster(kind, n, d, speed)), parse_job(job(workload,
                                                                               strategy)))
        ev = evaluate(ctx, strategy)
        out[kind] = {"iteration_time": ev.result.iteration_time, "planner_s": ev.seconds}
        if kind == "topoopt":
            notes = ev.strategy.notes
            mp_ops = list(notes["model_parallel"])
            out[kind] |= {"strides": notes["topology"]["strides"],
                          "diameter": notes["topology"]["diameter"],
                          "model_parallel": len(mp_ops),
                          "allreduce": notes["allreduce"]["chosen"]}
        elif mp_ops:  # the same hybrid on this fabric, when faster than data parallel
            th = hybrid_time(ctx, mp_ops, ev.strategy.network)
            out[kind] |= {"data_parallel": ev.result.iteration_time, "hybrid": th,
                          "iteration_time": min(ev.result.iteration_time, th)}
    t = out["topoopt"]["iteration_time"]
    for r in out.values():
        r["ratio_to_topoopt"] = r["iteration_time"] / t
    return out


def hybrid_time(ctx, mp_ops: list[str], network) -> float:
    """Simulated iteration of the hybrid `topoopt` chose (`mp_ops` model parallel, each on the
    owner the strategy gives it; the rest data parallel, ring AllReduce in host order) on
    another fabric: the baselines get the paper's footing, the best strategy on each fabric."""
    from topoctl.sim.engine import simulate
    from topoctl.sim.schedules import ALGORITHMS
    from topoctl.strategies.hybrid import hybrid_tasks, mp_candidates, owners

    own = owners(list(ctx.hosts), mp_candidates(ctx.graph))
    tasks, _, _ = hybrid_tasks(ctx, {o: own[o] for o in mp_ops}, list(ctx.hosts),
                               ALGORITHMS["ring"])
    return simulate(tasks, network, record=False).iteration_time


def planner_time(n: int, d: int = 4, workload: str = "resnet") -> float:
    from topoctl.planner import evaluate, prepare
    from topoctl.spec.cluster_load import parse_cluster
    from topoctl.spec.job import parse_job

    ctx = prepare(parse_cluster(cluster("topoopt", n, d, "100gbit")),
                  parse_job(job(workload, "topoopt")))
    t0 = time.perf_counter()
    evaluate(ctx, "topoopt")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from topoctl.strategies import topoopt

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--degrees", default="4,8")
    ap.add_argument("--speeds", default="25gbit,100gbit")
    ap.add_argument("--workloads", default=",".join(JOBS))
    ap.add_argument("--planner-time", default="128,1024", help="n values ('' to skip)")
    ap.add_argument("--mcmc", type=int, default=12, help="MCMC iterations per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    topoopt.MCMC_ITERATIONS, topoopt.ROUNDS = args.mcmc, args.rounds
    kinds = ("topoopt", "fat-tree", "fat-tree-2:1", "fat-tree-4:1", "expander")
    if not args.json:  # rows as they finish: a long run keeps what it has done
        print(f"{'d':>2} {'speed':>8} {'workload':<11}" + "".join(f"{k:>14}" for k in kinds)
              + "   topoopt: strides, MP groups, AllReduce", flush=True)
    results = []
    for d in (int(x) for x in args.degrees.split(",")):
        for speed in args.speeds.split(","):
            for w in [x for x in args.workloads.split(",") if x]:
                print(f"n={args.hosts} d={d} {speed} {w} ...", file=sys.stderr, flush=True)
                results.append({"n": args.hosts, "d": d, "speed": speed, "workload": w,
                                "fabrics": run_case(args.hosts, d, speed, w)})
                if not args.json:
                    print(_row(results[-1], kinds), flush=True)
    ptimes = {}
    for n in (int(x) for x in args.planner_time.split(",") if x):
        print(f"planner time n={n} ...", file=sys.stderr, flush=True)
        ptimes[n] = planner_time(n)
    load = Path("/proc/loadavg").read_text().split()[:3]
    if args.json:
        print(json.dumps({"results": results, "planner_seconds": ptimes, "loadavg": load},
                         indent=1))
        return 0
    print("(baselines: iteration time / topoopt's; > 1: topoopt is faster)")
    for n, s in ptimes.items():
        print(f"planner time (topoopt, resnet50, d=4) n={n}: {s:.1f} s")
    print(f"load average {' '.join(load)}")
    return 0


def _row(r: dict, kinds: tuple[str, ...]) -> str:
    """One table row: topoopt's iteration time, each baseline's as a ratio to it."""
    f = r["fabrics"]
    row = "".join(f"{f[k]['iteration_time'] * 1e3:>9.1f} ms " if k == "topoopt" else
                  f"{f[k]['ratio_to_topoopt']:>13.2f}x" for k in kinds)
    t = f["topoopt"]
    return (f"{r['d']:>2} {r['speed']:>8} {r['workload']:<11}{row}   {t['strides']}, "
            f"{t['model_parallel']}, {t['allreduce']}")


if __name__ == "__main__":
    sys.exit(main())
