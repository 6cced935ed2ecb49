"""The `+bandwidth` post-pass in the simulator: every example cluster (plans/*-cluster.yaml) x
every strategy that plans on it, the simulated iteration time without the post-pass and with it
under both LP objectives (docs/bandwidth.md), side by side:

- base:          the strategy as planned (max-min fair sharing of every link);
- proportional:  +bandwidth, objective proportional (routed paths, links shared by demand);
- minmax:        +bandwidth, objective minmax, routed paths only (`multipath: false`, the default);
- minmax+mp:     +bandwidth, objective minmax with one-hop detours (`multipath: true`).

A ratio below 1.00 is a gain. Strategies that cannot plan a cluster (topoopt on a switched
fabric, trees with several ranks per host, ...) and post-passes that cannot be rendered
(multipath into a switch) are shown as `-` with the reason in --json. Also per row: the LP's
communication time T* (minmax with multipath) and the iteration's bottleneck, to explain
where the post-pass has no room.

    python -m bench.planner.bandwidth_sim [--clusters hetero8,mesh4] [--job plans/mlp-job.yaml]
        [--strategies baseline,trees,placement,pipeline,topoopt] [--json]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml

from bench.common import ROOT
from topoagent.cliutil import ArgumentParser

STRATEGIES = ("baseline", "trees", "placement", "pipeline", "topoopt")
VARIANTS = (("proportional", "proportional", False), ("minmax", "minmax", False),
            ("minmax+mp", "minmax", True))


def clusters() -> list[str]:
    """Names of the example clusters (plans/NAME-cluster.yaml), sorted."""
    return sorted(p.name.removesuffix("-cluster.yaml") for p in ROOT.glob("plans/*-cluster.yaml"))


def bottleneck(strategy, demand: dict) -> dict:
    """The pair with the largest demand / (best single-path rate) and its link: where the
    iteration's traffic is limited whatever the rates (routed paths only)."""
    from topoctl.bandwidth.paths import candidate_paths
    from topoctl.sim.fabric import network_from_fabric

    net = network_from_fabric(strategy.fabric, strategy.hops)
    paths = candidate_paths(strategy.hops, sorted(demand), detours=False)
    load: dict[str, float] = {}
    for p, b in demand.items():
        for ln in paths[p][0]:
            load[ln] = load.get(ln, 0.0) + b
    if not load:
        return {}
    ln = max(sorted(load), key=lambda k: load[k] / net.links[k].capacity)
    return {"link": ln, "bytes": load[ln], "capacity_Bps": net.links[ln].capacity,
            "seconds": load[ln] / net.links[ln].capacity}


def run_case(cluster_file: Path, job_doc: dict, names: list[str]) -> list[dict]:
    """One row per strategy: base and post-pass iteration times (s), LP details, errors."""
    from topoagent.protocol import TopoError
    from topoctl.bandwidth.paths import traffic_matrix
    from topoctl.planner import prepare
    from topoctl.sim.engine import simulate
    from topoctl.spec.cluster_load import load_cluster
    from topoctl.spec.job import parse_job
    from topoctl.strategies import available
    from topoctl.strategies.bandwidth import with_bandwidth

    cluster = load_cluster(cluster_file)
    ctx = prepare(cluster, parse_job(job_doc | {"strategies": list(names)}, "job"))
    rows = []
    for name in names:
        row: dict = {"cluster": cluster.name, "strategy": name}
        rows.append(row)
        t0 = time.perf_counter()
        try:
            base = available()[name](ctx)
            row["base"] = simulate(base.tasks, base.network, record=False).iteration_time
        except TopoError as e:
            row["error"] = "; ".join(m for _, m in e.problems) or str(e)
            continue
        demand = traffic_matrix(base.tasks)
        row["bottleneck"] = bottleneck(base, demand)
        for label, obj, mp in VARIANTS:
            try:
                s = with_bandwidth(ctx, base, obj, mp)
            except TopoError as e:
                row[label] = None
                row[f"{label}_error"] = "; ".join(m for _, m in e.problems) or str(e)
                continue
            row[label] = simulate(s.tasks, s.network, record=False).iteration_time
            bw = s.notes["bandwidth"]
            row[f"{label}_lp"] = {"lp_comm_time": bw["lp_comm_time"], "ceil": bw["ceil"],
                                  "multipath_pairs": bw["multipath_pairs"]}
        row["seconds"] = time.perf_counter() - t0
    return rows


def table(rows: list[dict]) -> str:
    """The side-by-side table (iteration times in s, post-pass / base ratios)."""
    head = (f"{'cluster':<11} {'strategy':<10} {'base s/it':>10} "
            + "".join(f"{v[0]:>20}" for v in VARIANTS) + f"  {'LP T*':>8}  bottleneck")
    out = [head]
    for r in rows:
        if "error" in r:
            out.append(f"{r['cluster']:<11} {r['strategy']:<10} {'-':>10}  ({r['error'][:70]})")
            continue
        cells = ""
        for label, _, _ in VARIANTS:
            t = r.get(label)
            cells += f"{'-':>20}" if t is None else f"{t:>11.3f} ({t / r['base']:.3f})"
        lp = (r.get("minmax+mp_lp") or r.get("minmax_lp") or {}).get("lp_comm_time")
        b = r.get("bottleneck") or {}
        out.append(f"{r['cluster']:<11} {r['strategy']:<10} {r['base']:>10.3f} {cells}  "
                   + (f"{lp:>8.3f}" if lp is not None else f"{'-':>8}")
                   + (f"  {b['link']} {b['seconds']:.3f} s" if b else ""))
    out.append("(s/it simulated; in brackets: / base, < 1 is a gain; LP T*: the minmax LP's "
               "communication time with detours; bottleneck: the busiest routed link and its "
               "bytes / capacity)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 0, 1 on a usage error or bad input."""
    ap = ArgumentParser(prog="python -m bench.planner.bandwidth_sim",
                        description=__doc__.split("\n")[0])
    ap.add_argument("--clusters", default=",".join(clusters()),
                    help="comma-separated names of plans/NAME-cluster.yaml")
    ap.add_argument("--job", type=Path, default=ROOT / "plans" / "mlp-job.yaml")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    known = set(clusters())
    names = [c for c in args.clusters.split(",") if c]
    bad = [c for c in names if c not in known]
    if bad or not names:
        ap.error(f"unknown cluster {', '.join(bad) or '(none)'} "
                 f"(known: {', '.join(sorted(known))})")
    strategies = [s for s in args.strategies.split(",") if s]
    if not strategies or any(s not in STRATEGIES for s in strategies):
        ap.error(f"--strategies: choose from {', '.join(STRATEGIES)}")
    try:
        job_doc = yaml.safe_load(args.job.read_text())
    except (OSError, yaml.YAMLError) as e:
        ap.error(f"--job {args.job}: {e}")
    if not isinstance(job_doc, dict):
        ap.error(f"--job {args.job}: not a job file")
    from topoagent.cliutil import run_guarded

    rows: list[dict] = []

    def go() -> int:
        for c in names:
            print(f"{c} ...", file=sys.stderr, flush=True)
            rows.extend(run_case(ROOT / "plans" / f"{c}-cluster.yaml", job_doc, strategies))
        return 0

    rc = run_guarded("bench.planner.bandwidth_sim", go)
    if rc:
        return rc
    load = Path("/proc/loadavg").read_text().split()[:3]
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.json:
        print(json.dumps({"job": str(args.job), "rows": rows, "loadavg": load, "date": date},
                         indent=1))
    else:
        print(table(rows))
        print(f"job {args.job.name}; {date}; load average {' '.join(load)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
