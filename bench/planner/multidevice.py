"""Hosts with several accelerators, in the simulator (issue 51's evaluation): every strategy x
catalog model on

- (a) the two-type cluster (`plans/hap8x8-cluster.yaml`: 2 x 8 V100 + 6 x 8 P100, 10 Gbit/s);
- (b) the rail-optimised cluster (`plans/rails4x8-cluster.yaml`: 4 x 8 H100, 8 rails);
- (c) example clusters of plans/ with 4 A100 per host (`--four`, default switch8, tworack8,
  hetero8).

Each case reports the prediction, the plan's bound (`planner.lower_bound`) and their ratio,
the flat ring over every rank in rank order (what the runtime ran before the hierarchical
contract) simulated on the same network, the planner's CPU seconds per strategy (prepare
excluded), or the refusal with its reason. For `trees` also its AllReduces alone against
the hierarchical bound (`collective.hierarchical.hierarchical_bound`), bucket by bucket.
Costs are the roofline of each host's own device type (the jobs' `cost.device` dropped);
batches are rounded to a multiple of the ranks.

    python -m bench.planner.multidevice [--models mlp,resnet50,...] [--strategies a,b]
        [--cases a,b,c] [--four switch8,tworack8] [--json]

Goals (issue 51): every strategy plans every case or names what stops it; the hierarchical
trees within 10% of their bound; planning at most 60 s of CPU for 64 devices.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import yaml

from bench.common import PLANS
from topoctl.collective.hierarchical import hierarchical_bound
from topoctl.planner import evaluate, lower_bound, prepare
from topoctl.sim.engine import simulate
from topoctl.sim.schedules import ALGORITHMS
from topoctl.sim.tasks import Collective
from topoctl.spec.cluster import ClusterError
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import JobError, parse_job
from topoctl.strategies.baseline import dp_tasks
from topoctl.strategies.devices import device_groups, host_goodput

MODELS = ["mlp", "resnet50", "vgg16", "bert", "dlrm", "candle-uno"]
STRATEGIES = ["baseline", "baseline+bandwidth", "baseline+shares", "baseline+sfb",
              "baseline+disco", "trees", "trees+bandwidth", "trees+shares", "topoopt",
              "pipeline", "placement"]
FOUR = ["switch8", "tworack8", "hetero8"]


def cluster_doc(case: str) -> dict:
    """The cluster of a case: `hap8x8`, `rails4x8`, or `NAME` of plans/ with 4 A100s per
    host."""
    if case in ("hap8x8", "rails4x8"):
        return yaml.safe_load((PLANS / f"{case}-cluster.yaml").read_text())
    doc = yaml.safe_load((PLANS / f"{case}-cluster.yaml").read_text())
    doc["defaults"]["gpus"] = {"count": 4, "type": "A100"}
    for h in doc["hosts"]:
        h.pop("gpus", None)
        h.pop("speed", None)
    doc["name"] = f"{doc['name']}-x4"[:32]
    return doc


def job_doc(model: str, ranks: int) -> dict:
    """The model's example job, roofline on each host's own device, batch a multiple of
    `ranks` (at least one sample per rank)."""
    doc = yaml.safe_load((PLANS / f"{model}-job.yaml").read_text())
    doc["cost"] = {k: v for k, v in doc.get("cost", {}).items() if k != "device"}
    g = doc["batch"]["global"]
    doc["batch"]["global"] = max(ranks, g // ranks * ranks)
    doc["strategies"] = ["baseline"]
    return doc


def flat_ring(ctx, network) -> float:
    """The flat ring over every rank in rank order on `network` (the device nodes)."""
    members = [d for g in device_groups(ctx) for d in g]
    tasks, _ = dp_tasks(ctx, members, ALGORITHMS["ring"])
    return simulate(tasks, network, record=False).iteration_time


def trees_alone(ctx, s) -> dict:
    """The trees strategy's AllReduces alone on its network against the hierarchical bound,
    summed over the buckets."""
    k = len(ctx.ranks[ctx.hosts[0]])
    dev = min(ctx.cluster.device_link(h).bandwidth for h in ctx.hosts)
    host = max(host_goodput(ctx).values())
    sim = bound = 0.0
    for t in s.tasks:
        if isinstance(t, Collective):
            sim += simulate([Collective("x", t.schedule)], s.network,
                            record=False).iteration_time
    for b in s.buckets:
        bound += hierarchical_bound(b, len(ctx.hosts), k, dev, host)
    return {"alone_s": sim, "bound_s": bound, "ratio": sim / bound if bound else None}


def run_case(case: str, model: str, strategies: list[str]) -> dict:
    """One cluster x model: every strategy's prediction, bound, CPU seconds or refusal."""
    cluster = parse_cluster(cluster_doc(case))
    ranks = sum(cluster.gpus(h.name).count for h in cluster.hosts)
    t0 = time.process_time()
    ctx = prepare(cluster, parse_job(job_doc(model, ranks)), use_cache=False)
    out = {"case": case, "model": model, "ranks": ranks,
           "prepare_cpu_s": round(time.process_time() - t0, 2), "strategies": {}}
    for name in strategies:
        t0 = time.process_time()
        try:
            e = evaluate(ctx, name)
        except (JobError, ClusterError) as err:
            out["strategies"][name] = {"refused": "; ".join(m for _, m in err.problems)}
            continue
        cpu = time.process_time() - t0
        bound = lower_bound(ctx, e.strategy)[0]
        row = {"predicted_s": e.result.iteration_time, "bound_s": bound,
               "ratio": e.result.iteration_time / bound if bound else None,
               "cpu_s": round(cpu, 2)}
        if name == "baseline":
            out["flat_ring_s"] = flat_ring(ctx, e.strategy.network)
        if name == "trees":
            row["hierarchical"] = trees_alone(ctx, e.strategy)
        out["strategies"][name] = row
    return out


def _line(r: dict) -> str:
    head = (f"{r['case']:>14} {r['model']:>10} ranks {r['ranks']:>3} flat ring "
            f"{r.get('flat_ring_s', float('nan')) * 1e3:9.2f} ms")
    rows = [head]
    for name, v in r["strategies"].items():
        if "refused" in v:
            rows.append(f"    {name:<20} REFUSED {v['refused']}")
            continue
        h = v.get("hierarchical")
        extra = (f"  alone/hier-bound {h['ratio']:.3f}" if h and h["ratio"] else "")
        rows.append(f"    {name:<20} {v['predicted_s'] * 1e3:9.2f} ms  bound "
                    f"{v['bound_s'] * 1e3:9.2f}  ratio {v['ratio']:.3f}  cpu {v['cpu_s']:5.1f} s"
                    + extra)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print a table (or --json)."""
    ap = argparse.ArgumentParser(prog="python -m bench.planner.multidevice", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--cases", default="a,b,c", help="a: hap8x8, b: rails4x8, c: --four")
    ap.add_argument("--four", default=",".join(FOUR))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cases = []
    for c in args.cases.split(","):
        cases += {"a": ["hap8x8"], "b": ["rails4x8"], "c": args.four.split(",")}[c]
    results = []
    for case in cases:
        for model in args.models.split(","):
            r = run_case(case, model, args.strategies.split(","))
            results.append(r)
            if not args.json:
                print(_line(r), flush=True)
    if args.json:
        json.dump(results, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
