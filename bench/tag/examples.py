"""`strategies: [tag]` on every example job x every example cluster: planned or not, and the
planning seconds (issue 34's "done when": each within 60 s).

    python -m bench.tag.examples [--clusters NAME ...]

Plans as ``topoctl plan --no-cache`` does (roofline, no machine timings), one line per case on
stderr, a markdown table on stdout. The seconds are wall-clock on this machine."""

from __future__ import annotations

import sys
import time

from bench.common import PLANS
from topoagent.cliutil import ArgumentParser
from topoagent.protocol import TopoError
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import load_job


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="bench.tag.examples", description=__doc__.split("\n")[0])
    ap.add_argument("--clusters", nargs="+", help="cluster names (default: every example)")
    a = ap.parse_args(argv)
    clusters = sorted(p.name.removesuffix("-cluster.yaml") for p in PLANS.glob("*-cluster.yaml"))
    jobs = sorted(p.name.removesuffix("-job.yaml") for p in PLANS.glob("*-job.yaml"))
    rows = ["| cluster | job | seconds | result |", "|---|---|---|---|"]
    for c in a.clusters or clusters:
        cluster = load_cluster(PLANS / f"{c}-cluster.yaml")
        for j in jobs:
            job = load_job(PLANS / f"{j}-job.yaml").model_copy(update={"strategies": ["tag"]})
            t0 = time.perf_counter()
            try:
                doc, _, _ = make_plan(cluster, job, use_cache=False)
                tag = doc["metadata"]["collective"]["tag"]
                res = (f"{doc['metadata']['prediction']['iteration_time'] * 1e3:.4g} ms, "
                       f"{tag['groups'][0]['decision']}"
                       + (" (cut by the clock)" if tag.get("cut_short") else ""))
            except TopoError as e:
                res = f"not planned: {str(e).splitlines()[0][:120]}"
            s = time.perf_counter() - t0
            rows.append(f"| {c} | {j} | {s:.1f} | {res} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
