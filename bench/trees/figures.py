"""The tree-runtime figures table of issue 16: trees measured / optimum, vs gloo's default
all_reduce, and the cost model's prediction error, on the hetero8 and tworack8 labs at the
file's own rates and x0.25; plus what the cable emulation itself costs (iperf3).

    .venv/bin/python -m bench.trees.figures [--iters 3] [--gloo-iters 3] [--bytes 16672800]
        [--labs plans/hetero8-cluster.yaml plans/tworack8-cluster.yaml] [--scales 1 0.25]
        [--json OUT]

Run it on a quiet machine (it says the load average). Per lab and scale: a throwaway lab
(``bench.trees.allreduce_lab``: ``topoctl lab up``, training addresses, routes over the cables),
8 ranks over gloo, gloo's all_reduce and the packed trees side by side in one run (medians of
``--iters`` / ``--gloo-iters``), the trees' chunk from the cost model
(``topoctl.collective.trees.pipeline``, calibration from ``python -m
topotrain.collectives.calibrate``, measured first if missing); then, in the same lab, iperf3 on
every tree edge in both directions at the rate the trees put on it, for ``--iperf-seconds``:
how busy the machine is from the emulation alone. The optimum is ``M / tau`` (partition bound
of the cables' rates). Takes long at the file's rates x0.25: gloo's ring crosses the slow
cables (tworack8: about 95 s per all_reduce).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import busy_share, machine_cpu, stop_all
from bench.trees import allreduce_lab
from topotrain.timing import ensure_calibration

GRAD = 16_672_800


def iperf_emulation(seconds: float):
    """A ``during`` hook: iperf3 on every tree edge, both directions, at the trees' rate on it
    (sum of the rates of the trees that use the edge, bit/s); machine busy meanwhile."""

    def run(ctx: dict) -> dict:
        lab, hosts, addr, plan = ctx["lab"], ctx["hosts"], ctx["addr"], ctx["plan"]
        rate: dict[tuple[str, str], float] = {}
        for t in plan.trees:
            for p, c in t.edges:
                for a, b in ((hosts[c], hosts[p]), (hosts[p], hosts[c])):
                    rate[(a, b)] = rate.get((a, b), 0.0) + t.rate * 8  # bytes/s -> bit/s
        servers, clients = [], []
        try:
            for i, (_a, b) in enumerate(sorted(rate)):
                port = 5301 + i
                servers.append(subprocess.Popen(
                    ["ip", "netns", "exec", lab.netns(b), "iperf3", "-s", "-1", "-p", str(port),
                     "-B", addr[b]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
            b0, t0 = machine_cpu(), time.perf_counter()
            for i, (a, b) in enumerate(sorted(rate)):
                clients.append(subprocess.Popen(
                    ["ip", "netns", "exec", lab.netns(a), "iperf3", "-c", addr[b], "-p",
                     str(5301 + i), "-B", addr[a], "-t", str(seconds), "-b",
                     str(int(rate[(a, b)])), "-J"], stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, text=True))
            got = 0.0
            for c in clients:
                out, _ = c.communicate(timeout=seconds + 30)
                try:
                    got += json.loads(out)["end"]["sum_received"]["bits_per_second"]
                except (ValueError, KeyError):
                    pass
            b1, wall = machine_cpu(), time.perf_counter() - t0
        finally:
            stop_all(servers + clients)
        busy = busy_share(b0, b1)
        cores = os.cpu_count() or 1
        # wire bytes per core-second of emulation + TCP (the cost model's
        # emulation_bytes_per_s; includes other jobs' load when the machine is not quiet)
        return {"edges": len(rate), "offered_bit_s": sum(rate.values()),
                "received_bit_s": got, "seconds": wall, "machine_busy": busy,
                "emulation_bytes_per_core_s": got / 8 / max(busy * cores, 1e-9)}

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labs", nargs="+", default=["plans/hetero8-cluster.yaml",
                                                  "plans/tworack8-cluster.yaml"])
    ap.add_argument("--scales", nargs="+", type=float, default=[1.0, 0.25])
    ap.add_argument("--bytes", type=int, default=GRAD)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--gloo-iters", type=int, default=3)
    ap.add_argument("--iperf-seconds", type=float, default=10.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    cal = ensure_calibration()
    rows = []
    for lab in args.labs:
        for scale in args.scales:
            a = argparse.Namespace(lab=lab, scale=scale, bytes=args.bytes, iters=args.iters,
                                   ring_iters=args.gloo_iters, chunk_bytes=None,
                                   name=f"tp6{os.getpid() % 10000}", trees_only=False,
                                   no_ring=True, json=None)
            allreduce_lab.run(a, during=iperf_emulation(args.iperf_seconds))
            r = a.result
            trees = r["results"]["packed trees"]
            gloo = r["results"]["gloo all_reduce (default)"]
            pred = r["predicted"]["seconds"]
            rows.append({"lab": Path(lab).stem.replace("-cluster", ""), "scale": scale,
                         "optimum_s": r["optimum_s"], "trees_s": trees["median"],
                         "gloo_s": gloo["median"], "predicted_s": pred,
                         "predicted": r["predicted"], "trees_busy": trees["machine_busy"],
                         "trees_cores": trees["bench_cores"], "chunk_bytes": r["chunk_bytes"],
                         "ntrees": r["trees"], "emulation": r.get("during"),
                         "correct": trees["correct"] and gloo["correct"],
                         "load_average": r["load_average"]})
    print(f"\nM = {args.bytes / 2**20:.1f} MiB, medians of {args.iters} (trees) / "
          f"{args.gloo_iters} (gloo); calibration {cal.get('key')} (per message "
          f"{cal['per_message_s'] * 1e6:.0f} us)")
    print("| lab | rates | trees measured / optimum | trees vs gloo all_reduce | prediction "
          "error | trees s (pred. parts: network, CPU; they overlap) | "
          "machine busy (trees / iperf3 alone) | load avg |")
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        em = x["emulation"] or {}
        p = x["predicted"]
        print(f"| {x['lab']} | x{x['scale']:g} | {x['optimum_s'] / x['trees_s']:.1%} | "
              f"{x['gloo_s'] / x['trees_s']:.1f}x | "
              f"{(x['predicted_s'] - x['trees_s']) / x['trees_s']:+.1%} | {x['trees_s']:.3f} "
              f"({p['network_s']:.3f}, {p['cpu_s']:.3f}) | {x['trees_busy']:.0%} / "
              f"{em.get('machine_busy', float('nan')):.0%} | {x['load_average'][0]:.1f} |"
              + ("" if x["correct"] else " WRONG RESULT |"))
    for x in rows:
        em = x["emulation"] or {}
        if em:
            print(f"{x['lab']} x{x['scale']:g}: iperf3 {em['received_bit_s'] / 1e9:.2f} of "
                  f"{em['offered_bit_s'] / 1e9:.2f} Gbit/s on {em['edges']} directed edges, "
                  f"machine {em['machine_busy']:.0%} busy: "
                  f"{em['emulation_bytes_per_core_s'] / 1e9:.2f} GB per core-second (iperf3's "
                  "own pacing timers included: not the cost model's emulation_bytes_per_s, "
                  "which bench/lab/emulation_fit.py fits)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "calibration": cal}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
