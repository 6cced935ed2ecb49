"""TAG evaluation 3: the search against the exhaustive optimum on small cases (4 hosts, 6
op-groups, 300 playouts, both priors), under the same simulator.

    python -m bench.tag.small [--narrow]

Prints one markdown row per case and prior: distinct plans the enumeration valued
(`topoctl.tag.exhaustive.optimum`), the optimum's and TAG's simulated iteration, the gap (goal:
within 2%). The space is the one `tag` searches (widened: unequal replica counts, packed trees,
batch shares by speed; docs/tag.md); `--narrow`: the space before the widening (equal replica
counts, ring or server, even rows). Roofline costs: the same figures on any machine. The unit test
(`tests/unit/test_tag.py`) checks three of these cases with the uniform prior."""

from __future__ import annotations

import argparse
import sys

from bench.common import PLANS, job
from topoctl.planner import prepare
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.tag import kit
from topoctl.tag import exhaustive
from topoctl.tag.clusters import generated
from topoctl.tag.evaluator import reward
from topoctl.tag.prior import shipped
from topoctl.tag.search import run_search
from topoctl.tag.space import plan_of

CASES = [("gen4-1", "vgg", 256), ("gen4-2", "mlp", 512), ("hetero4c", "mlp", 384),
         ("gen4-3", "resnet", 256), ("gen4-4", "bert", 64)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--narrow", action="store_true", help="the space before the widening")
    widen = not ap.parse_args().narrow
    print("| cluster | model | prior | groups | distinct plans | optimum ms | TAG ms | gap |\n"
          "|---|---|---|---|---|---|---|---|")
    for case, model, batch in CASES:
        cl = (load_cluster(PLANS / "hetero4-compute-cluster.yaml") if case == "hetero4c"
              else parse_cluster(generated(4, int(case[-1]))))
        ctx = prepare(cl, parse_job(job(model, {}, batch)), use_cache=False)
        for net in (None, shipped()):
            out = run_search(ctx, kit(), 300, seed=0, max_groups=6, net=net, widen=widen)
            ev = out.evaluator
            s, _, n = exhaustive.optimum(
                out.space, lambda s, o=out, e=ev: reward(o.base_time, e.time(plan_of(s))))
            t = ev.time(plan_of(s))
            print(f"| {case} | {model} | {'gnn' if net else 'uniform'} | {len(out.groups)} | "
                  f"{n} | {t * 1e3:.3f} | {out.time * 1e3:.3f} | "
                  f"{100 * (out.time / t - 1):+.2f}% |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
