"""Fit the lab's cable emulation cost per wire byte on this machine (``emulation_bytes_per_s``).

    python -m bench.lab.emulation_fit [--lab plans/tworack8-cluster.yaml ...] [--chunk-bytes N ...]
        [--bytes 15936000] [--iters 3] [--json OUT]

What the cost model's ``LabProfile.emulation_bytes_per_s`` stands for: bytes moved per
core-second of the whole path a lab byte takes (veth pairs, the tc HTB shaping and mirred
redirects of the cables, both ends' TCP and gloo). For every (cluster, chunk) it runs the
lock-step tree AllReduce of ``--bytes`` on the lab at the file's own rates, 8 ranks on this
machine (``python -m bench.trees.allreduce_lab --scale 1 --trees-only``), and reads the whole
machine's CPU during it (/proc/stat: median seconds x machine busy x cores). The model's CPU
part over all ranks is ``A + B / e`` in the emulation cost ``e`` (two predictions with
different ``e`` give ``A`` and ``B``); the ``e`` at which the model's core-seconds equal the
machine's is the fit. Printed per run with the prediction at the current value, and the median
over the runs. The same method fitted the default 0.62e9 on the Intel Xeon VM
(bench/results/emulation-cost-2026-11-26.md).

For comparison, in the same lab right after the AllReduce: unpaced iperf3 (cubic, ``--bidir``)
on every cable at once, the machine's CPU per wire byte of bulk streams (the cheapest the
emulation gets: full-size segments, no pacing); ``python -m bench.trees.figures`` measures the paced
kind (iperf3 ``-b`` at the trees' rates).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.common import ROOT, busy_share, machine_cpu, stop_all
from bench.common.trees import schedule_prediction
from bench.trees import allreduce_lab
from topoctl.collective.trees.pipeline import runtime_costs
from topoctl.labprofile import machine_profile
from topotrain.timing import load_calibration


def core_seconds(pred, cores: int) -> float:
    """The model's CPU seconds over all ranks of a lab prediction (``cpu_s`` is their sum over
    the cores when that is the larger bound, as it is with 8 ranks on 2 cores)."""
    return pred.cpu_s * cores


def received_bytes(ctx: dict) -> int:
    """Bytes received on the lab hosts' cable ports so far (``ip -j -s link``)."""
    total = 0
    for h in ctx["hosts"]:
        out = subprocess.run(["ip", "-n", ctx["lab"].netns(h), "-j", "-s", "link"],
                             capture_output=True, text=True, check=True).stdout
        total += sum(link["stats64"]["rx"]["bytes"] for link in json.loads(out)
                     if link["ifname"] != "lo" and not link["ifname"].startswith("tp5d"))
    return total


def bulk_streams(ctx: dict, seconds: float = 4.0) -> dict:
    """Unpaced iperf3 (cubic, both directions) on every cable at once: wire bytes (counted
    once, at the receiver) per machine core-second over ``seconds`` of steady state."""
    lab, addr = ctx["lab"], ctx["addr"]
    pairs = sorted(ctx["cables"])
    servers, clients = [], []
    try:
        for i, (_a, b) in enumerate(pairs):
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", lab.netns(b), "iperf3", "-s", "-1", "-p", str(5301 + i),
                 "-B", addr[b]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        for i, (a, b) in enumerate(pairs):
            clients.append(subprocess.Popen(
                ["ip", "netns", "exec", lab.netns(a), "iperf3", "-c", addr[b], "-B", addr[a],
                 "-p", str(5301 + i), "-t", str(seconds + 2.5), "-C", "cubic", "--bidir"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.5)  # past slow start
        r0, c0, w0 = received_bytes(ctx), machine_cpu(), time.perf_counter()
        time.sleep(seconds)
        r1, c1, wall = received_bytes(ctx), machine_cpu(), time.perf_counter() - w0
        for c in clients:
            c.wait(timeout=seconds + 30)
    finally:
        stop_all(servers + clients)
    busy = busy_share(c0, c1)
    cores = os.cpu_count() or 1
    return {"received_bit_s": (r1 - r0) * 8 / wall, "machine_busy": busy,
            "bytes_per_core_s": (r1 - r0) / max(busy * cores * wall, 1e-9)}


def fit_one(lab: str, chunk: int, nbytes: int, iters: int) -> dict:
    """One lab run of the tree AllReduce and the emulation cost that explains its CPU."""
    ns = argparse.Namespace(lab=lab, scale=1.0, bytes=nbytes, iters=iters, ring_iters=1,
                            chunk_bytes=chunk, no_ring=True, trees_only=True,
                            name=f"tp5{os.getpid() % 100000}", lookahead=None, plan=None,
                            json=None)
    got: dict = {}

    def keep(ctx: dict) -> None:
        got.update(ctx)
        got["streams"] = bulk_streams(ctx)

    allreduce_lab.run(ns, during=keep)
    res = ns.result
    (name, r), = res["results"].items()
    costs = runtime_costs(load_calibration())
    profile = machine_profile()
    links = [(a, b, rate / 8.0) for (a, b), (rate, _, _) in got["cables"].items()]
    mtu = got["lab"].layout.mtu

    def model(e: float) -> float:
        p = schedule_prediction(got["sched"], got["hosts"], links, mtu, nbytes,
                                costs=costs, lab=replace(profile, emulation_bytes_per_s=e))
        return core_seconds(p, profile.cores)

    e1, e2 = 1e9, 0.25e9
    m1, m2 = model(e1), model(e2)
    b = (m2 - m1) / (1 / e2 - 1 / e1)
    a = m1 - b / e1
    measured = r["median"] * r["machine_busy"] * profile.cores
    fitted = b / (measured - a) if measured > a and b > 0 else float("nan")
    now = schedule_prediction(got["sched"], got["hosts"], links, mtu, nbytes, costs=costs,
                              lab=profile)
    return {"lab": lab, "chunk_bytes": got["sched"].chunk_bytes, "seconds": r["median"],
            "machine_busy": r["machine_busy"], "machine_core_s": measured,
            "model_core_s_without_emulation": a, "fitted_emulation_bytes_per_s": fitted,
            "predicted_s": now.seconds, "predicted_network_s": now.network_s,
            "predicted_cpu_s": now.cpu_s, "costs": costs.source,
            "emulation_bytes_per_s": profile.emulation_bytes_per_s,
            "bulk_streams": got["streams"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lab", nargs="+", default=[str(ROOT / "plans" / "tworack8-cluster.yaml"),
                                                 str(ROOT / "plans" / "hetero8-cluster.yaml")])
    ap.add_argument("--chunk-bytes", type=int, nargs="+", default=[32768, 65536])
    ap.add_argument("--bytes", type=int, default=15_851_560, help="AllReduce size (the MLP's)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    rows = []
    for lab in args.lab:
        for chunk in args.chunk_bytes:
            row = fit_one(lab, chunk, args.bytes, args.iters)
            rows.append(row)
            print(f"{Path(lab).stem} chunk {row['chunk_bytes']} B: {row['seconds']:.3f} s "
                  f"(predicted {row['predicted_s']:.3f}: network {row['predicted_network_s']:.3f}"
                  f", CPU {row['predicted_cpu_s']:.3f}), machine {row['machine_busy']:.0%} busy ="
                  f" {row['machine_core_s']:.3f} core-s, model without emulation "
                  f"{row['model_core_s_without_emulation']:.3f}: emulation "
                  f"{row['fitted_emulation_bytes_per_s'] / 1e9:.3f} GB per core-s; bulk iperf3 "
                  f"{row['bulk_streams']['received_bit_s'] / 1e9:.2f} Gbit/s, machine "
                  f"{row['bulk_streams']['machine_busy']:.0%} busy: "
                  f"{row['bulk_streams']['bytes_per_core_s'] / 1e9:.3f} GB per core-s",
                  flush=True)
    fits = [r["fitted_emulation_bytes_per_s"] for r in rows]
    print(f"median fit {statistics.median(fits) / 1e9:.3f} GB per core-s (in use: "
          f"{rows[0]['emulation_bytes_per_s'] / 1e9:.3f}, costs {rows[0]['costs']}); "
          f"load average {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
