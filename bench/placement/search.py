"""Placement search, side by side in one run (the thesis's evaluation, issue 13).

For a BERT-style and a VGG-style catalog model on 4 and 8 devices of mixed speed (A100 and V100
alternating, roofline costs, a non-blocking switch): the exact MILP on the un-coarsened op
graph (node limit, outer time limit; its gap), the MILP on the coarse graph (fusion +
co-location), the heuristic (HEFT + partition, coarse graph), the coarse-graph search as the
planner runs it (`placement.search`: HEFT, partition and one device scored by simulation,
`search auto`; plus the MILP warm-started from them, `search milp`; the same search on the
un-coarsened graph, to separate what coarsening buys from what the search buys), and data
parallelism. The baseline of the speed-up column stays the MILP on the un-coarsened graph
from scratch (scipy, the original formulation). For each:
search seconds (coarsening included for the coarse rows) and the simulated makespan of one
iteration of `--micro` micro-batches (`placement.simulate`: the placed graph's tasks, transfers
as flows on the fabric; data parallel: compute then ring AllReduce). Targets: coarse MILP >= 100x
faster than the un-coarsened one at <= 5 % worse makespan; 12-layer BERT on 8 devices planned
in <= 30 s. Prints a table; `--json` writes the rows.

    python -m bench.placement.search [--node-limit 10] [--time-limit 300] [--json out.json]
        [--baseline earlier.json]   # reuse an earlier run's un-coarsened MILP rows
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from topoctl.graph.capture import capture_catalog
from topoctl.graph.coarsen import coarsen_graph, from_opgraph
from topoctl.graph.cost import roofline_costs
from topoctl.graph.devices import DEVICES
from topoctl.placement import heft, milp, search
from topoctl.placement.build import build_problem
from topoctl.placement.problem import PlacementError
from topoctl.placement.simulate import placed_tasks
from topoctl.sim.engine import simulate
from topoctl.sim.network import star
from topoctl.sim.schedules import ring_allreduce
from topoctl.sim.tasks import Collective, Compute

MODELS = {
    "bert12": ("bert", {"layers": 12}, 8),  # BERT-base: 12 layers, hidden 768, seq 128
    "vgg16": ("vgg", {"depth": 16}, 32),
}
LINK = 100e9 / 8  # 100 Gbit/s per host port, bytes/s


def devices(n: int) -> list[str]:
    return [f"d{i}" for i in range(n)]


def kinds(n: int) -> dict[str, str]:
    return {h: ("A100" if i % 2 == 0 else "V100") for i, h in enumerate(devices(n))}


def dp_makespan(og, costs_by_type: dict, n: int, micro: int) -> float:
    """Data parallel over n devices: each computes micro*batch/n samples, then ring AllReduce."""
    net = star(devices(n), LINK)
    tasks = []
    for h, t in kinds(n).items():
        work = sum(c.fwd + c.bwd for c in costs_by_type[t].values()) * micro / n
        tasks.append(Compute(f"c@{h}", h, work))
    tasks.append(Collective("ar", ring_allreduce(devices(n), float(og.param_bytes)),
                            tuple(f"c@{h}" for h in devices(n))))
    return simulate(tasks, net, record=False).iteration_time


def row(model: str, n: int, micro: int, node_limit: int, time_limit: float,
        baseline: dict | None = None) -> list[dict]:
    name, params, batch = MODELS[model]
    og = capture_catalog(name, params, batch)
    costs_by_type = {t: roofline_costs(og, DEVICES[t]) for t in ("A100", "V100")}
    hosts = devices(n)
    op_cost = {h: {o: c.fwd + c.bwd for o, c in costs_by_type[kinds(n)[h]].items()}
               for h in hosts}
    cap = {h: DEVICES[kinds(n)[h]].memory for h in hosts}
    net = star(hosts, LINK)
    groups = [[h] for h in hosts]
    out = []

    def record(label: str, seconds: float, pl, p, extra: dict) -> None:
        span = (simulate(placed_tasks(p, pl.assign, hosts), net, record=False).iteration_time
                if pl is not None else math.nan)
        out.append({"model": model, "devices": n, "method": label, "search_s": seconds,
                    "makespan_s": span, "nodes": len(p.nodes),
                    "devices_used": len(set(pl.assign)) if pl else 0, **extra})

    fine = from_opgraph(og, costs_by_type["A100"])
    if baseline is not None:  # recorded by an earlier run (--baseline): not re-run
        out.append({**baseline, "recorded": True})
    else:
        t0 = time.perf_counter()
        pf = build_problem(fine, groups, op_cost, cap, net, micro)
        try:
            mf = milp.place(pf, node_limit=node_limit, time_limit=time_limit)
            extra = {"gap": mf.gap, "time_limited": mf.info["time_limited"]}
        except PlacementError as e:
            mf, extra = None, {"error": str(e)}
        record("MILP, un-coarsened", time.perf_counter() - t0, mf, pf, extra)
    t0 = time.perf_counter()
    coarse, stats = coarsen_graph(fine, LINK)
    pc = build_problem(coarse, groups, op_cost, cap, net, micro)
    mc = milp.place(pc, node_limit=node_limit, time_limit=time_limit)
    record("MILP, coarse", time.perf_counter() - t0, mc, pc,
           {"gap": mc.gap, "time_limited": mc.info["time_limited"],
            "coarsening": stats.to_dict()})
    t0 = time.perf_counter()
    coarse, _ = coarsen_graph(fine, LINK)
    pc = build_problem(coarse, groups, op_cost, cap, net, micro)
    h = heft.place(pc)
    record("heuristic, coarse", time.perf_counter() - t0, h, pc, {"chosen": h.info["chosen"]})
    for label, use_milp in (("search auto, coarse", False), ("search milp, coarse", True),
                            ("search milp, un-coarsened", True)):
        t0 = time.perf_counter()
        coarse = fine if "un-coarsened" in label else coarsen_graph(fine, LINK)[0]
        t1 = time.perf_counter()
        pc = build_problem(coarse, groups, op_cost, cap, net, micro)

        def score(assign: list[int], pc=pc) -> float:
            return simulate(placed_tasks(pc, assign, hosts), net, record=False).iteration_time

        s = search.search(pc, score, milp=use_milp, node_limit=node_limit,
                          time_limit=time_limit)
        parts = {"coarsen": t1 - t0, **s.info["seconds"]}
        record(label, time.perf_counter() - t0, s, pc,
               {"chosen": s.info["chosen"], "parts_s": parts, "gap": s.info["milp"].get("gap"),
                "candidates": s.info["candidates"]})
    out.append({"model": model, "devices": n, "method": "data parallel", "search_s": 0.0,
                "makespan_s": dp_makespan(og, costs_by_type, n, micro), "nodes": len(og.ops),
                "devices_used": n})
    return out


def table(rows: list[dict]) -> str:
    head = ("model", "devices", "method", "graph nodes", "search s", "makespan ms", "gap",
            "speedup vs un-coarsened MILP", "makespan vs un-coarsened")
    lines = [" | ".join(head), " | ".join("-" * len(x) for x in head)]
    parts = []
    for r in rows:
        ref = next((x for x in rows if x["model"] == r["model"] and x["devices"] == r["devices"]
                    and x["method"] == "MILP, un-coarsened"), None)
        speed = (f"{ref['search_s'] / r['search_s']:.0f}x" if ref and r["search_s"] > 0
                 and r["method"] != "data parallel" else "-")
        rel = (f"{r['makespan_s'] / ref['makespan_s'] - 1:+.1%}"
               if ref and ref["makespan_s"] == ref["makespan_s"] else "-")
        gap = r.get("gap")
        lines.append(" | ".join([
            r["model"], str(r["devices"]), r["method"] + (" (time limit)" if r.get(
                "time_limited") else "") + (" (recorded)" if r.get("recorded") else ""),
            str(r["nodes"]), f"{r['search_s']:.2f}",
            f"{r['makespan_s'] * 1e3:.2f}", "-" if gap is None else f"{gap:.1%}", speed, rel]))
        if "parts_s" in r:
            parts.append(f"{r['model']} x {r['devices']}, {r['method']}: chose {r['chosen']}; "
                         + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in r["parts_s"].items()))
    return "\n".join(lines + ["", "search parts:"] + parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--devices", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per iteration")
    ap.add_argument("--node-limit", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=300.0,
                    help="outer safety limit per MILP (reported when it cuts the search)")
    ap.add_argument("--json")
    ap.add_argument("--baseline", help="a --json file of an earlier run: its 'MILP, "
                    "un-coarsened' rows are reused instead of re-running them (marked "
                    "'recorded'; speed-ups are then against that run's times)")
    args = ap.parse_args(argv)
    rows = []
    for m in args.models:
        for n in args.devices:
            base = None
            if args.baseline:
                with open(args.baseline) as f:
                    base = next(r for r in json.load(f) if r["model"] == m
                                and r["devices"] == n and r["method"] == "MILP, un-coarsened")
            rows += row(m, n, args.micro, args.node_limit, args.time_limit, base)
            print(f"done {m} on {n} devices", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
