"""Planner benchmark: packed trees vs the optimum, and planning time, up to 1,024 workers.

    .venv/bin/python -m bench.trees.scale [--quick] [--max-trees K] [--json OUT]

For each fabric: the kept trees' rate (<= K trees), the column-generation LP optimum over all
trees, the best independent upper bound (partition bound tau on direct-connect fabrics, cut and
ingress bounds, the LP's dual certificate), achieved / bound, and planning seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

from topoctl.collective.trees.bounds import best_bound, tree_bounds
from topoctl.collective.trees.pack import plan_trees
from topoctl.fabric.capgraph import build_capgraph


def torus(k):
    out = []
    for i, j in itertools.product(range(k), range(k)):
        out += [((i, j), ((i + 1) % k, j), 1.0), ((i, j), (i, (j + 1) % k), 1.0)]
    return out, None


def hypercube(d):
    n = 1 << d
    return [(a, a ^ (1 << b), 1.0) for a in range(n) for b in range(d) if a < a ^ (1 << b)], None


def circulant(n, offsets):
    return [(i, (i + o) % n, 1.0) for i in range(n) for o in offsets], None


def mesh(n, slow=None):
    return [(a, b, 1.0 if slow is not None and slow in (a, b) else 10.0)
            for a, b in itertools.combinations(range(n), 2)], None


def tworack(n):
    return [(a, b, 10.0 if a < n // 2 <= b or b < n // 2 <= a else 100.0)
            for a, b in itertools.combinations(range(n), 2)], None


def leafspine(leaves, hosts, spines, uplink):
    links, workers = [], []
    for lf in range(leaves):
        for h in range(hosts):
            links.append((f"h{lf}.{h}", f"l{lf}", 1.0))
            workers.append(f"h{lf}.{h}")
        links += [(f"l{lf}", f"s{s}", uplink) for s in range(spines)]
    return links, workers


CASES = {
    "mesh-8 (one slow host)": lambda: mesh(8, slow=7),
    "two-rack mesh 8": lambda: tworack(8),
    "mesh-64": lambda: mesh(64),
    "two-rack mesh 64": lambda: tworack(64),
    "torus 16x16": lambda: torus(16),
    "torus 32x32 (1,024)": lambda: torus(32),
    "hypercube 2^10 (1,024)": lambda: hypercube(10),
    "circulant 1,024 {1,3,7,11}": lambda: circulant(1024, [1, 3, 7, 11]),
    "star 64 (switch)": lambda: leafspine(1, 64, 0, 1.0),
    "leaf-spine 8x8, 2 spines (64)": lambda: leafspine(8, 8, 2, 2.0),
    "leaf-spine 32x32, 4 spines (1,024)": lambda: leafspine(32, 32, 4, 4.0),
}
QUICK = ["mesh-8 (one slow host)", "two-rack mesh 8", "mesh-64", "torus 16x16",
         "star 64 (switch)", "leaf-spine 8x8, 2 spines (64)"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-trees", type=int, default=None, help="default: auto")
    ap.add_argument("--only", help="substring of case names")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    names = QUICK if args.quick else list(CASES)
    if args.only:
        names = [n for n in CASES if args.only in n]
    print(f"load average before: {os.getloadavg()}  (2 cores, shared)")
    print("| fabric | workers | links | trees | rate | LP optimum | bound (name) | "
          "rate/bound | LP/bound | plan s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        links, workers = CASES[name]()
        g = build_capgraph(links, workers)
        t0 = time.perf_counter()
        plan = plan_trees(g, max_trees=args.max_trees)
        secs = time.perf_counter() - t0
        b = tree_bounds(g, lp_upper=plan.upper_bound)
        bname, bval = best_bound(b)
        row = {"fabric": name, "workers": len(g.workers), "links": g.m, "trees": len(plan.trees),
               "rate": plan.rate, "lp": plan.lp_optimum, "bound": bval, "bound_name": bname,
               "seconds": secs, "timings": plan.timings, "bounds": b}
        rows.append(row)
        print(f"| {name} | {len(g.workers)} | {g.m} | {len(plan.trees)} | {plan.rate:.4g} | "
              f"{plan.lp_optimum:.4g} | {bval:.4g} ({bname}) | {plan.rate / bval:.2%} | "
              f"{plan.lp_optimum / bval:.2%} | {secs:.1f} |", flush=True)
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
