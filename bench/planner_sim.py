"""Benchmark: simulate one data-parallel iteration on 128 hosts (target <= 1 s).

ResNet-50 (fp16, 51 MB of gradients in 25 MB buckets: 3 ring AllReduces of 128 members, 2*127
rounds each) and BERT-base (264 MB, 11 buckets), on a 128-port switch and on a degree-4 direct
fabric. Times the baseline strategy's task construction and the simulation separately."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from planner_common import direct, job, switched  # noqa: E402

from topoctl.planner import prepare  # noqa: E402
from topoctl.sim.engine import simulate  # noqa: E402
from topoctl.spec.cluster_load import parse_cluster  # noqa: E402
from topoctl.spec.job import parse_job  # noqa: E402
from topoctl.strategies.baseline import plan  # noqa: E402


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
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 128)
