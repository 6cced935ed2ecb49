"""TAG evaluation 1 (simulator): catalog models x clusters, `tag` against every other strategy,
MCMC with the same simulator and budget, and MCTS with the uniform prior.

    python -m bench.tag.sim [--playouts 2000] [--quick] [--json]

Clusters: the example clusters whose hosts differ (hetero4-compute: CPU hosts of speed
1/0.5/0.75/0.25; hetero8: mixed cables), mesh4 and switch8 (equal hosts) and generated ones
(`topoctl.tag.clusters`: mixed GPU types or CPU speeds, mixed links; 4 and 8 hosts). Models:
mlp, vgg, resnet, bert (float16 roofline on GPUs, the CPU roofline on cpu hosts; no
machine timings, so the figures are the same on any machine). Per case: every strategy's
simulated iteration (the planner's `evaluate`, as `topoctl plan` scores it), the speed-up of
`tag` over the best other strategy, over MCMC and over MCTS with the uniform prior (same
playouts), and tag's search seconds. "Heterogeneous" = hosts that differ in compute.
"""

from __future__ import annotations

import json
import sys
import time

from bench.common import PLANS
from topoagent.cliutil import ArgumentParser
from topoctl.planner import evaluate, prepare
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.tag import kit
from topoctl.tag import mcmc
from topoctl.tag.clusters import generated
from topoctl.tag.evaluator import reward
from topoctl.tag.prior import shipped
from topoctl.tag.search import run_search
from topoctl.tag.space import plan_of
from topoctl.tag.train import job_doc

OTHERS = ["baseline", "trees", "baseline+shares", "baseline+sfb", "placement", "pipeline",
          "topoopt"]
MODELS = [("mlp", 512), ("vgg", 256), ("resnet", 256), ("bert", 64)]


def clusters(quick: bool) -> list[tuple[str, object, bool]]:
    """(name, cluster, hosts differ in compute)."""
    out = [("hetero4-compute", load_cluster(PLANS / "hetero4-compute-cluster.yaml"), True),
           ("hetero8", load_cluster(PLANS / "hetero8-cluster.yaml"), False),
           ("mesh4", load_cluster(PLANS / "mesh4-cluster.yaml"), False)]
    gens = [(4, 101, "gpu"), (8, 103, "gpu"), (8, 104, "cpu")]
    if not quick:
        out.append(("switch8", load_cluster(PLANS / "switch8-cluster.yaml"), False))
        gens += [(4, 102, "cpu"), (8, 105, "gpu")]
    for n, seed, kind in gens:
        c = parse_cluster(generated(n, seed, compute=kind))
        out.append((f"gen{n}-{kind}-{seed}", c, True))
    return out


def one_case(cluster, model: str, batch: int, playouts: int) -> dict:
    """Every strategy's simulated iteration on one case, tag's search time, MCMC and uniform
    MCTS at the same budget."""
    jd = job_doc(model, batch) | {"strategies": OTHERS + ["tag"],
                                  "tag": {"playouts": playouts, "prior": "gnn"}}
    ctx = prepare(cluster, parse_job(jd), use_cache=False)
    times: dict[str, float | None] = {}
    for s in OTHERS:
        try:
            times[s] = evaluate(ctx, s).result.iteration_time
        except Exception:  # a strategy that cannot plan this case (topoopt on a switch, ...)
            times[s] = None
    t0 = time.perf_counter()
    ev = evaluate(ctx, "tag")
    search_s = time.perf_counter() - t0
    times["tag"] = ev.result.iteration_time
    uni = run_search(ctx, kit(), playouts, seed=0, net=None)
    times["mcts-uniform"] = uni.time
    sp, evl = uni.space, uni.evaluator
    best, _, _ = mcmc.search(sp, lambda s: reward(uni.base_time, evl.time(plan_of(s))),
                             playouts, seed=0)
    times["mcmc"] = evl.time(plan_of(best))
    others = {k: v for k, v in times.items() if k in OTHERS and v is not None}
    best_other = min(others, key=others.get)
    return {"times": times, "best_other": best_other, "search_s": search_s,
            "speedup_vs_best_other": others[best_other] / times["tag"],
            "speedup_vs_mcmc": times["mcmc"] / times["tag"],
            "speedup_vs_uniform": times["mcts-uniform"] / times["tag"],
            "hosts": len(ctx.hosts), "tag_decision": ev.strategy.notes["tag"]["groups"][0][
                "decision"]}


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="bench.tag.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--playouts", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="fewer clusters and models")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    shipped()  # the weights load before any timing
    rows = []
    models = MODELS[:2] if a.quick else MODELS
    for name, c, het in clusters(a.quick):
        for model, batch in models:
            r = one_case(c, model, batch, a.playouts) | {"cluster": name, "model": model,
                                                         "heterogeneous": het}
            rows.append(r)
            print(f"{name:22s} {model:6s} tag {r['times']['tag'] * 1e3:9.2f} ms  best other "
                  f"{r['best_other']:15s} x{r['speedup_vs_best_other']:.3f}  mcmc "
                  f"x{r['speedup_vs_mcmc']:.3f}  uniform x{r['speedup_vs_uniform']:.3f}  "
                  f"search {r['search_s']:.1f} s  [{r['tag_decision']}]", file=sys.stderr,
                  flush=True)
    het = [r for r in rows if r["heterogeneous"]]
    summary = {
        "cases": len(rows),
        "never_slower": all(r["speedup_vs_best_other"] >= 1 - 1e-9 for r in rows),
        "slower_cases": [(r["cluster"], r["model"], r["speedup_vs_best_other"]) for r in rows
                         if r["speedup_vs_best_other"] < 1 - 1e-9],
        "het_cases": len(het),
        "het_min_speedup": min((r["speedup_vs_best_other"] for r in het), default=None),
        "het_max_speedup": max((r["speedup_vs_best_other"] for r in het), default=None),
        "het_at_least_1.3": sum(r["speedup_vs_best_other"] >= 1.3 for r in het),
        "max_search_s_8_hosts": max((r["search_s"] for r in rows if r["hosts"] == 8),
                                    default=None)}
    if a.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1, default=str))
    else:
        print(table(rows))
        print(json.dumps(summary, default=str))
    return 0


def table(rows: list[dict]) -> str:
    """A markdown table of the rows (ms, speed-ups)."""
    out = ["| cluster | model | tag ms | best other (ms) | tag vs best other | vs MCMC | "
           "vs uniform MCTS | search s | tag's first decision |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["times"]
        out.append(f"| {r['cluster']} | {r['model']} | {t['tag'] * 1e3:.2f} | {r['best_other']} "
                   f"({t[r['best_other']] * 1e3:.2f}) | {r['speedup_vs_best_other']:.3f}x | "
                   f"{r['speedup_vs_mcmc']:.3f}x | {r['speedup_vs_uniform']:.3f}x | "
                   f"{r['search_s']:.1f} | {r['tag_decision']} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
