"""DisCo's buckets against the anchors, in the simulator and in the lab (issue 35).

Per catalog model: two CPU hosts on a switch whose port speed is chosen so that one
AllReduce of all the gradients takes about as long as the compute of an iteration (the
model planned once at 1 Gbit/s with its ops timed on this CPU, then the speed scaled by
T_comm / T_compute and rounded). The model is planned with `disco`; the anchors come from the
same search (`topoctl.strategies.disco.search`: DDP's defaults, the caps of {1, 5, 10, 25,
50, 100} MB, MG-WFBP, the Horovod-style autotune; the best of them by the simulator is "best
anchor"). DisCo's search may choose forward overlap (`job.collective.bucket_overlap:
forward`, the AllReduces waited for in the next forward); "disco-backward" is the best
candidate it simulated with the AllReduces under the backward pass only (DDP's timeline).
Every variant runs through the same runtime (`topotrain.buckets`, the plan's
`job.collective.bucket_plan`), only its partition (and overlap) differs, so the anchors are
measured the same way as DisCo.

The metric: the share of the gap to ideal overlap that is closed,
(T_default - T) / (T_default - max(T_compute, T_comm)), T_default DDP's defaults. In the
simulator T_compute is the iteration without AllReduce and T_comm one AllReduce of every
gradient alone. In the lab both come from the one-bucket variant, where the AllReduce
starts after the backward pass: T_comm the median duration of its bucket's AllReduce
(`buckets` events), T_compute the median iteration less it.

Lab runs are timed: run the bench under the machine-wide lock (``flock
/tmp/topoctl-quiet.lock python -m bench.sync.disco ...``, split by `--models` to hold it ~20 min at
most); the lab is named `BENCH_LAB_PREFIX` (default ``dbuck``) and the process id. Each
variant is measured `--repeats` times on the model's lab in rotating order,
the median of the runs' iteration times (each the median over its iterations after the
warm-up) is the figure. The JSON keeps, per variant and run, both ranks' `iter` events (the
phases, CPU seconds and each bucket's ready / start / end times: 0.3-0.4 MB per model) and
each variant's candidate, for comparing the runtime's timeline with the simulator's.

    python -m bench.sync.disco [--models mlp bert resnet] [--sim-only] [--repeats 3]
                          [--iterations 12] [--out bench/results/disco-DATE.json]
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from bench.common import ROOT, switched
from topoagent.cliutil import ArgumentParser

LAB_PREFIX = os.environ.get("BENCH_LAB_PREFIX", "dbuck")
MODELS = {  # catalog model, params, global batch (two ranks): small enough for this CPU
    "mlp": ("mlp", {"layers": 4, "hidden": 1024}, 1024),
    "bert": ("bert", {"layers": 4, "hidden": 256, "heads": 4, "seq": 64, "vocab": 2000}, 16),
    "resnet": ("resnet", {"depth": 18, "width": 16, "classes": 10, "image": 32}, 128),
}
ISSUE_ANCHORS = ("ddp-default", "cap-1MB", "cap-5MB", "cap-10MB", "cap-25MB", "cap-50MB",
                 "cap-100MB", "mg-wfbp", "autotune")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cluster_doc(mbit: int) -> dict:
    """Two CPU hosts on one switch, `mbit` Mbit/s ports, jumbo frames."""
    doc = switched(2, f"{mbit}mbit", "cpu")
    doc["name"] = f"disco{mbit}"
    doc["fabric"]["mtu"] = 9000
    return doc


def job_doc(model: str) -> dict:
    """The job of `MODELS[model]`, planned with `disco` (ranks timed on this CPU)."""
    catalog, params, batch = MODELS[model]
    return {"apiVersion": "topoctl/v1", "kind": "Job", "name": f"disco-{model}",
            "model": {"catalog": catalog, "params": params}, "batch": {"global": batch},
            "parallelism": {"data": True}, "strategies": ["disco"],
            "sync": {"algorithm": "ring", "bucket": "25MB"}, "cost": {"method": "roofline"}}


def _plan(model: str, mbit: int):
    """(cluster, plan document, context, evaluated disco strategy) at `mbit`."""
    from topoctl.planner import make_plan
    from topoctl.spec.cluster_load import parse_cluster
    from topoctl.spec.job import parse_job

    cluster = parse_cluster(cluster_doc(mbit))
    doc, ctx, evals = make_plan(cluster, parse_job(job_doc(model)), retime=True)
    return cluster, doc, ctx, evals[0]


def balanced_speed(model: str) -> int:
    """Port speed (Mbit/s, 2 significant digits) where T_comm is about T_compute."""
    _, _, _, ev = _plan(model, 1000)
    notes = ev.strategy.notes["disco"]
    mbit = 1000 * notes["t_comm"] / notes["t_compute"]
    digits = 10 ** max(0, int(math.log10(mbit)) - 1)
    return int(max(20, min(4000, round(mbit / digits) * digits)))


def with_partition(plan: dict, units, c, predicted: float, slicing: dict | None = None
                   ) -> dict:
    """`plan` with its bucket plan replaced by the candidate `c`'s (a partition of `units`,
    its overlap and held-back tail: `topoctl.disco.search.Candidate`; a sliced candidate's
    `slicing`, the plan's ``bucket_slicing``)."""
    from topoctl.disco.search import issue_order
    from topoctl.strategies.disco import bucket_plan

    buckets = bucket_plan(units, c.cuts, issue_order(len(c.cuts), c.tail))
    out = json.loads(json.dumps(plan))
    collective = out["job"]["collective"]
    collective["bucket_plan"] = buckets
    collective["buckets"] = [b["bytes"] for b in buckets]
    collective.pop("bucket_overlap", None)
    collective.pop("bucket_slicing", None)
    if c.overlap == "forward":
        collective["bucket_overlap"] = "forward"
    if slicing is not None:
        collective["bucket_slicing"] = slicing
    out["metadata"]["prediction"]["iteration_time"] = predicted
    return out


def simulate_model(model: str) -> dict:
    """The model's plans and simulated figures: variants (partition plans), anchors, metric."""
    from topoctl.disco.search import Candidate
    from topoctl.strategies import baseline
    from topoctl.strategies.disco import ideal, search, slice_plan

    mbit = balanced_speed(model)
    cluster, doc, ctx, ev = _plan(model, mbit)
    t0 = time.perf_counter()
    found = search(ctx, baseline.plan(ctx), {"none": ctx.host_costs(ctx.hosts[0])},
                   progress=False)
    search_s = time.perf_counter() - t0
    # the search of whole buckets (before slicing): what the sliced schedule is compared with
    unsliced = search(ctx, baseline.plan(ctx), {"none": ctx.host_costs(ctx.hosts[0])},
                      progress=False, slicing=False)["result"]
    units, anchors, res = found["units"], found["anchors"], found["result"]
    t_compute, t_comm = ideal(ctx, units, found["score"])
    best_anchor = min(ISSUE_ANCHORS, key=lambda k: (anchors[k][1], k))
    # the best candidate the search simulated with the AllReduces under the backward only
    backward = min((t, c) for c, t in found["score"].memo.items() if c.overlap == "backward")
    variants = {"ddp-default": (Candidate("none", anchors["ddp-default"][0]),
                                anchors["ddp-default"][1]),
                "best-anchor": (Candidate("none", anchors[best_anchor][0]),
                                anchors[best_anchor][1]),
                "disco-backward": (backward[1], backward[0]),
                "disco": (res.best, res.cost),
                "one-bucket": (Candidate("none", anchors["one-bucket"][0]),
                               anchors["one-bucket"][1])}
    slicing = None
    if res.best.slice_bytes:
        slicing = {"slice_bytes": res.best.slice_bytes, "credit": res.best.credit,
                   "priority": slice_plan(ctx, units, res.best, found["model"])[1]}
    plans = {k: with_partition(doc, units, c, t, slicing if k == "disco" else None)
             for k, (c, t) in variants.items()}
    t_def = anchors["ddp-default"][1]
    ideal_t = max(t_compute, t_comm)
    bound = forward_bound(units, found["model"], t_compute)
    return {"model": model, "mbit": mbit, "cluster": cluster, "plans": plans,
            "best_anchor": best_anchor, "units": len(units.size),
            "buckets": {k: len(c.cuts) for k, (c, _) in variants.items()},
            # each variant's candidate (cuts, overlap, tail) and its simulated seconds
            "candidates": {k: [list(c.cuts), c.overlap, c.tail, t]
                           for k, (c, t) in variants.items()},
            "disco_overlap": res.best.overlap, "disco_tail": res.best.tail,
            "disco_slicing": slicing,
            # DisCo's partition is the best anchor's: the two lab figures then differ by noise
            "disco_is_best_anchor": res.best == Candidate("none", anchors[best_anchor][0]),
            "sim": {"t_compute": t_compute, "t_comm": t_comm,
                    "anchors": {k: anchors[k][1] for k in (*ISSUE_ANCHORS, "lb-optimum")},
                    "disco": res.cost, "best_anchor": anchors[best_anchor][1],
                    "disco_backward": backward[0],
                    "gap_closed": _gap(t_def, res.cost, ideal_t),
                    "disco_unsliced": unsliced.cost,
                    "unsliced_gap_closed": _gap(t_def, unsliced.cost, ideal_t),
                    "sliced_anchors": {k: t for k, (_, t) in found["sliced"].items()},
                    "backward_gap_closed": _gap(t_def, backward[0], ideal_t),
                    "forward_bound": bound, "forward_bound_gap": _gap(t_def, bound, ideal_t),
                    "best_anchor_gap_closed": _gap(t_def, anchors[best_anchor][1], ideal_t)},
            "search_seconds": search_s, "plan_search_seconds": ev.seconds,
            "simulations": res.evaluations}


def forward_bound(units, model: dict, t_compute: float) -> float:
    """A lower bound of any iteration whose AllReduces overlap the next forward, per
    parameter: the first op that owns parameters gets its last gradient at the end of the
    backward and its next forward needs them all-reduced, so T >= T_compute + alpha +
    beta x (that op's gradient bytes) (the plan's latency-bandwidth fit)."""
    first = max(units.pos)  # the op last in backward order: first in the forward
    nbytes = sum(b for b, p in zip(units.size, units.pos, strict=True) if p == first)
    return t_compute + model["alpha"] + model["beta"] * nbytes


def _gap(t_default: float, t: float, ideal_t: float) -> float | None:
    return (t_default - t) / (t_default - ideal_t) if t_default > ideal_t else None


def _events(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:  # "h0 [event 0] {...}": host, rank's event channel, the event
        head, _, body = line.partition("] ")
        if "[event " in head and body.startswith("{"):
            e = json.loads(body)
            if e.get("event") == "iter":
                out.append(e)
    return out


def run_variant(name: str, plan: dict, transport, iterations: int) -> dict:
    """Apply `plan` and train: the run's iteration time and its `iter` events."""
    from topoctl.rollout import twophase as rollout
    from topoctl.rollout.run import run_job

    report = rollout.apply_plan(plan, transport)
    if report.exit_code not in (0, 2):
        raise SystemExit(f"{name}: apply failed: {report.message}")
    lines: list[str] = []
    result = run_job(plan, transport, iterations=iterations, out=lines.append, verbose=True)
    if result.exit_code or not result.synchronous:
        raise SystemExit(f"{name}: training failed: {result.failure or 'ranks diverged'}\n"
                         + "\n".join(lines[-20:]))
    return {"seconds": result.iteration_time, "events": _events(lines)}


def _one_bucket_split(events: list[dict]) -> tuple[float, float]:
    """(T_compute, T_comm) from the one-bucket run's events after the warm-up."""
    its = [e for e in events if e["iter"] >= 2] or events
    comm = [e["buckets"][0][4] - e["buckets"][0][3] for e in its]
    compute = [e["seconds"] - (e["buckets"][0][4] - e["buckets"][0][3]) for e in its]
    return statistics.median(compute), statistics.median(comm)


def measure_model(sim: dict, repeats: int, iterations: int) -> dict:
    """The model's variants on a lab of its own, in the quiet window."""
    from topoctl.lab import lab as labmod
    from topoctl.rollout.transports.ssh import lab_ssh_transport

    names = list(sim["plans"])
    runs: dict[str, list[float]] = {k: [] for k in names}
    events: dict[str, list[list[dict]]] = {k: [] for k in names}
    split: list[tuple[float, float]] = []
    load0 = os.getloadavg()[0]
    lab_name = f"{LAB_PREFIX}{os.getpid() % 1000}"
    lab = labmod.up(sim["cluster"], name=lab_name)
    transport = lab_ssh_transport(lab)
    try:
        for r in range(repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:  # rotating order
                m = run_variant(k, sim["plans"][k], transport, iterations)
                runs[k].append(m["seconds"])
                events[k].append(m["events"])
                if k == "one-bucket":
                    split.append(_one_bucket_split(m["events"]))
                log(f"{sim['model']} {k}: {m['seconds']:.4f} s/it (run {r + 1})")
    finally:
        transport.close()
        labmod.down(lab_name)
    t = {k: statistics.median(v) for k, v in runs.items()}
    t_compute = statistics.median(s[0] for s in split)
    t_comm = statistics.median(s[1] for s in split)
    ideal_t = max(t_compute, t_comm)
    return {"t": t, "runs": runs, "t_compute": t_compute, "t_comm": t_comm,
            "gap_closed": _gap(t["ddp-default"], t["disco"], ideal_t),
            "best_anchor_gap_closed": _gap(t["ddp-default"], t["best-anchor"], ideal_t),
            "backward_gap_closed": _gap(t["ddp-default"], t["disco-backward"], ideal_t),
            "load_before": load0, "load_after": os.getloadavg()[0],
            "events": events}  # per variant, per run: the ranks' `iter` events


def table(rows: list[dict]) -> str:
    """Markdown table of every model: simulated and measured."""
    head = ("model", "port", "units/buckets (disco)", "disco's overlap (tail)", "best anchor",
            "T_def sim / lab", "T_best-anchor sim / lab", "T_disco-backward sim / lab",
            "T_disco sim / lab", "T_compute, T_comm sim / lab",
            "gap closed, disco-backward: sim / lab", "gap closed, disco: sim / lab",
            "forward bound (gap closed at most)", "prediction error (disco)", "search s")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s, m = r["sim"], r.get("lab")

        def pair(sim_v, lab_v, f="{:.4f}"):
            return f.format(sim_v) + " / " + (f.format(lab_v) if lab_v is not None else "-")

        lab_t = m["t"] if m else {}
        err = (abs(s["disco"] - lab_t["disco"]) / lab_t["disco"] if m else None)
        gaps = pair(s["gap_closed"] or 0, m["gap_closed"] if m else None, "{:.0%}")
        back_gaps = pair(s["backward_gap_closed"] or 0,
                         m["backward_gap_closed"] if m else None, "{:.0%}")
        out.append("| " + " | ".join([
            r["model"], f"{r['mbit']} Mbit/s", f"{r['units']}/{r['buckets']['disco']}",
            f"{r['disco_overlap']} ({r['disco_tail']})",
            r["best_anchor"], pair(s["anchors"]["ddp-default"], lab_t.get("ddp-default")),
            pair(s["best_anchor"], lab_t.get("best-anchor")),
            pair(s["disco_backward"], lab_t.get("disco-backward")),
            pair(s["disco"], lab_t.get("disco")),
            f"{s['t_compute']:.4f}, {s['t_comm']:.4f} / "
            + (f"{m['t_compute']:.4f}, {m['t_comm']:.4f}" if m else "-"),
            back_gaps, gaps, f"{s['forward_bound']:.4f} ({s['forward_bound_gap']:.0%})",
            f"{err:.1%}" if err is not None else "-",
            f"{r['plan_search_seconds']:.1f}"]) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--sim-only", action="store_true")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--out", type=Path,
                   default=ROOT / "bench" / "results" / f"disco-{time.strftime('%Y-%m-%d')}.json")
    args = p.parse_args(argv)
    rows = []
    for model in args.models:
        log(f"{model}: planning")
        r = simulate_model(model)
        log(f"{model}: {r['mbit']} Mbit/s, simulated {json.dumps(r['sim'])}")
        if not args.sim_only:
            r["lab"] = measure_model(r, args.repeats, args.iterations)
            log(f"{model}: measured {json.dumps({k: v for k, v in r['lab'].items()})}")
        rows.append(r)
        args.out.write_text(json.dumps([{k: v for k, v in x.items()
                                         if k not in ("cluster", "plans")} for x in rows],
                                       indent=1, default=str))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
