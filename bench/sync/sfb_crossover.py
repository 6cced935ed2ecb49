"""SFB against the AllReduce by global batch: predicted (and with --lab measured) iteration
times of the baseline ring and of the same plan with every hidden fully connected layer
synchronised by sufficient-factor broadcasting, the layers the 0/1 program would choose, and
the crossover per-replica batch of the formula, K* = 2MN / (P(M + N)) (traffic only).

    python -m bench.sync.sfb_crossover [--cluster plans/hetero8-cluster.yaml]
        [--job plans/mlp-job.yaml] [--batches 64 512 1024 2048] [--lab] [--out DIR] [--json]

Plans on this machine's lab timing (cpu hosts' ops timed on this CPU, cached) and, as
`topoctl plan --as-lab` does, on the cables the lab emulates (needs root). With ``--lab``
every plan is written to DIR (default: a temporary directory) and measured with
``python -m bench.planner.lab_check CLUSTER JOB --plan PLAN`` (its own lab, removed after),
whose output lines are printed as they are."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.common import PLANS
from topoagent.cliutil import ArgumentParser
from topoctl.lab.emulated import lab_emulation
from topoctl.planner import Evaluated, evaluate, prepare, render, score
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies import baseline
from topoctl.strategies.sfb import linear_layers, with_sfb


def hidden_layers(ctx) -> list[tuple[str, int, int]]:
    """The candidates wider than the classifier: (op, M, N) of every linear layer whose
    output is not the model's last (the MLP's 1024-wide layers)."""
    layers = linear_layers(ctx.graph)
    return [(op.name, m, n) for op, _mod, _k, m, n in layers[:-1]]


def one_batch(cluster_doc: dict, job_doc: dict, batch: int) -> dict:
    """Predictions at global batch `batch`: baseline, forced SFB, the program's choice."""
    job = parse_job(job_doc | {"batch": {"global": batch}, "strategies": ["baseline"]})
    ctx = prepare(parse_cluster(cluster_doc), job)
    base = evaluate(ctx, "baseline")
    hidden = hidden_layers(ctx)
    forced = with_sfb(ctx, baseline.plan(ctx), [op for op, _, _ in hidden])
    # scored as the planner scores a strategy (the steady period: ranks leave the gathers one
    # by one), not one isolated iteration
    forced_eval = Evaluated(forced, score(ctx, forced), 0.0)
    chosen = with_sfb(ctx, baseline.plan(ctx)).collective["sfb"]
    p = ctx.world_size
    return {"global": batch, "k": ctx.local_batch, "p": p,
            "baseline_s": base.result.iteration_time,
            "sfb_all_hidden_s": forced_eval.result.iteration_time,
            "program_chooses": chosen,
            "formula_k_star": {op: round(2 * m * n / (p * (m + n)), 2) for op, m, n in hidden},
            "plans": {"baseline": render(ctx, base, [base]),
                      "sfb": render(ctx, forced_eval, [forced_eval])}}


def measure(cluster: str, job_doc: dict, row: dict, out: Path) -> None:
    """Both plans of `row` measured in the lab (bench.planner.lab_check --plan)."""
    job_file = out / f"job-{row['global']}.yaml"
    job_file.write_text(yaml.safe_dump(job_doc | {"batch": {"global": row["global"]}}))
    for name, plan in row["plans"].items():
        plan_file = out / f"plan-{row['global']}-{name}.yaml"
        plan_file.write_text(yaml.safe_dump(plan, sort_keys=False))
        r = subprocess.run([sys.executable, "-m", "bench.planner.lab_check", cluster,
                            str(job_file), "--plan", str(plan_file)], capture_output=True,
                           text=True)
        print(f"global {row['global']} {name}:")
        print(r.stdout.rstrip() or r.stderr.rstrip())


def main(argv: list[str] | None = None) -> int:
    """Print the table (and with --lab the measurements); the exit code."""
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cluster", default=str(PLANS / "hetero8-cluster.yaml"))
    ap.add_argument("--job", default=str(PLANS / "mlp-job.yaml"))
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 512, 1024, 2048])
    ap.add_argument("--lab", action="store_true", help="measure every plan in a lab")
    ap.add_argument("--out", type=Path, help="where --lab writes the plans and jobs")
    ap.add_argument("--json", action="store_true", help="the rows as JSON (without plans)")
    args = ap.parse_args(argv)
    emulated, _cleared = lab_emulation(yaml.safe_load(Path(args.cluster).read_text()))
    job_doc = yaml.safe_load(Path(args.job).read_text())
    rows = [one_batch(emulated, job_doc, b) for b in args.batches]
    print("| global batch | K per replica | baseline s/it | SFB (all hidden) s/it | program "
          "chooses | formula K* |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['global']} | {r['k']} | {r['baseline_s']:.3f} | {r['sfb_all_hidden_s']:.3f}"
              f" | {', '.join(r['program_chooses']) or 'none'} | "
              f"{', '.join(f'{v:g}' for v in sorted(set(r['formula_k_star'].values())))} |")
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "plans"} for r in rows]))
    if args.lab:
        out = args.out or Path(tempfile.mkdtemp(prefix="sfb-crossover-"))
        out.mkdir(parents=True, exist_ok=True)
        for r in rows:
            measure(args.cluster, job_doc, r, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
