"""Benchmark: simulate one data-parallel iteration on 128 hosts (target <= 1 s).

ResNet-50 (fp16, 51 MB of gradients in 25 MB buckets: 3 ring AllReduces of 128 members, 2*127
rounds each) and BERT-base (264 MB, 11 buckets), on a 128-port switch and on a degree-4 direct
fabric. Times the baseline strategy's task construction and the simulation separately.

    python -m bench.planner.sim [HOSTS]
"""

from __future__ import annotations

import argparse
import time

from bench.common import direct, job, switched
from topoctl.planner import prepare
from topoctl.sim.engine import simulate
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.baseline import plan


def main(n: int = 128) -> None:
    cases = [("resnet50", "resnet", {"depth": 50}, 32 * n), ("bert-base", "bert", {}, 16 * n)]
    for fabric, cdata in (("switch", switched(n)), ("direct-d4", direct(n, 4))):
        cluster = parse_cluster(cdata)
        for name, model, params, batch in cases:
            ctx = prepare(cluster, parse_job(job(model, params, batch)), use_cache=False)
            t0 = time.perf_counter()
            s = plan(ctx)
            t1 = time.perf_counter()
            res = simulate(s.tasks, s.network, record=False)
            t2 = time.perf_counter()
            print(f"{fabric:10} {name:9} hosts={n} buckets={len(s.buckets):2} "
                  f"tasks={len(s.tasks)} strategy={t1 - t0:.3f}s simulate={t2 - t1:.3f}s "
                  f"predicted={res.iteration_time * 1e3:.2f}ms")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hosts", nargs="?", type=int, default=128, help="hosts (128)")
    main(ap.parse_args().hosts)
