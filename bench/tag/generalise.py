"""TAG evaluation 2 (generalisation): the shipped prior on models and cluster shapes it was not
trained on, in playouts.

    python -m bench.tag.generalise [--budget 200] [--json]

Trained (`topoctl.tag.train`): mlp and vgg on generated 4-host clusters (seeds 0-5). Tested
here: the held-out models (`HELD_OUT_MODELS`: resnet, bert) and also the trained ones, on
generated clusters of 8 hosts (seeds 500+, never seen), direct and switched, GPU and CPU. Per
case the uniform-prior search runs with 10 x `budget` playouts; its best is the reference; the
number of playouts the GNN-prior search needs to come within 2% of it (from `SearchResult.
improvements`; no anchors in either search, so the prior alone guides them) is reported as a
share of the uniform search's 10 x budget: goal <= 25%. Simulator only, deterministic.
"""

from __future__ import annotations

import json
import sys

from topoagent.cliutil import ArgumentParser
from topoctl.planner import prepare
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.tag import kit
from topoctl.tag.clusters import generated
from topoctl.tag.prior import shipped
from topoctl.tag.search import run_search
from topoctl.tag.train import HELD_OUT_MODELS, TRAIN_MODELS, job_doc

# held-out cluster shapes: 8 hosts (training saw 4), both fabrics, GPU and CPU hosts
CLUSTERS = [(8, 501, "gpu", "direct"), (8, 502, "gpu", "switched"), (8, 503, "cpu", "direct"),
            (8, 504, "cpu", "switched")]


def needed(improvements: list[tuple[int, float]], target: float) -> int | None:
    """Playouts after which the best value reached `target` (None: never)."""
    return next((p for p, v in improvements if v >= target), None)


def one_case(cluster, model: str, batch: int, budget: int) -> dict:
    ctx = prepare(cluster, parse_job(job_doc(model, batch)), use_cache=False)
    ref = run_search(ctx, kit(), 10 * budget, net=None, use_anchors=False)
    gnn = run_search(ctx, kit(), 10 * budget, net=shipped(), use_anchors=False)
    # within 2% of the reference time: value >= t_base / (1.02 t_ref) - 1
    target = ref.base_time / (1.02 * ref.time) - 1 - 1e-12
    n_gnn = needed(gnn.result.improvements, target)
    n_uni = needed(ref.result.improvements, target)
    return {"ref_ms": ref.time * 1e3, "gnn_ms": gnn.time * 1e3, "gnn_playouts": n_gnn,
            "uniform_playouts": n_uni, "share_of_10x": None if n_gnn is None
            else n_gnn / (10 * budget)}


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="bench.tag.generalise", description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for n, seed, kind, shape in CLUSTERS:
        c = parse_cluster(generated(n, seed, shape=shape, compute=kind))
        for model, batch in HELD_OUT_MODELS + TRAIN_MODELS:
            r = one_case(c, model, batch, a.budget) | {
                "cluster": f"gen{n}-{kind}-{seed}", "model": model,
                "held_out_model": (model, batch) in HELD_OUT_MODELS}
            rows.append(r)
            print(f"{r['cluster']:16s} {model:6s} uniform@{10 * a.budget} {r['ref_ms']:.3f} ms"
                  f" (reached at {r['uniform_playouts']}), gnn reaches within 2% at "
                  f"{r['gnn_playouts']} playouts", file=sys.stderr, flush=True)
    shares = [r["share_of_10x"] for r in rows]
    ok = [s for s in shares if s is not None]
    summary = {"cases": len(rows), "never_reached": sum(s is None for s in shares),
               "median_share": sorted(ok)[len(ok) // 2] if ok else None,
               "max_share": max(ok) if ok else None,
               "within_25pct": sum(s is not None and s <= 0.25 for s in shares)}
    if a.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    else:
        print("| cluster | model | held-out model | uniform @10x: ms (playouts to reach) | "
              "GNN playouts to within 2% | share of 10x |\n|---|---|---|---|---|---|")
        for r in rows:
            s = "never" if r["share_of_10x"] is None else f"{100 * r['share_of_10x']:.1f}%"
            print(f"| {r['cluster']} | {r['model']} | {'yes' if r['held_out_model'] else 'no'}"
                  f" | {r['ref_ms']:.3f} ({r['uniform_playouts']}) | {r['gnn_playouts']} | {s} |")
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
