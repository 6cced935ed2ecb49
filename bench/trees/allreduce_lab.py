"""Measured AllReduce on a lab (real namespaces, tc-shaped cables, real gloo traffic).

    python -m bench.trees.allreduce_lab --lab plans/tworack8-cluster.yaml [--scale 0.25]
        [--bytes 33554432] [--chunk-bytes N] [--iters 3] [--no-ring] [--json OUT]
        [--plan PLAN]

Builds a throwaway lab (``topoctl lab up``, name ``tp5...``) from the cluster file, with cable
rates multiplied by ``--scale`` so that 2 cores are not the bottleneck. Every host gets a
training address (on a local veth pair: this kernel has no dummy driver), a /32 route per
peer over their direct cable (parallel cables: the fastest one) and fewest-hop routes through
forwarding hosts to the others: the baseline routing. Packed
trees are planned for the cables' rates, then 8 ranks over gloo compare, side by side in one
run: gloo's default all_reduce, a ring in the best order (maximum bottleneck) and the packed
trees (the lock-step runtime; chunk from the cost model, ``topoctl.collective.trees.pipeline``,
unless ``--chunk-bytes``), with the cost model's prediction of the trees' time. Reports time,
algbw (M / t) and measured/optimal (optimum = M / tau, the partition bound). Always removes
the lab. Direct-connect clusters only. ``--plan``: the lab cabled as the plan's fabric says and
the plan's own tree schedule and chunk run instead of freshly packed trees (e.g. a TopoOpt plan's
path trees, one gradient bucket at a time: ``--bytes`` the plan's largest bucket), predicted by
the same cost model (``bench.common.trees.schedule_prediction``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common.trees import schedule_prediction, trees_for
from topoagent.cliutil import ArgumentParser
from topoctl.collective.trees.bounds import partition_bound
from topoctl.fabric.capgraph import build_capgraph

PY = sys.executable
TOPOCTL = str(Path(sys.executable).with_name("topoctl"))
RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)$")
UNIT = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def scaled_cluster(path: Path, scale: float, name: str) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc["name"] = name

    def fix(v):
        m = RATE.match(str(v))
        if not m:
            return v
        return f"{int(float(m.group(1)) * UNIT[m.group(2)] * scale / 1000)}kbit"

    for link in doc["fabric"]["links"]:
        if "bandwidth" in link:
            link["bandwidth"] = fix(link["bandwidth"])
    if "nic_speed" in doc.get("defaults", {}):
        doc["defaults"]["nic_speed"] = fix(doc["defaults"]["nic_speed"])
    return doc


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def first_hops(src: str, hosts: list[str], cables: dict) -> dict[str, str]:
    """Fewest-hop first hop from ``src`` to every host (BFS; host forwarding)."""
    adj: dict[str, list[str]] = {h: [] for h in hosts}
    for a, b in cables:
        adj[a].append(b)
        adj[b].append(a)
    first: dict[str, str] = {}
    todo = []
    for nb in sorted(adj[src]):
        first[nb] = nb
        todo.append(nb)
    for x in todo:
        for y in sorted(adj[x]):
            if y != src and y not in first:
                first[y] = first[x]
                todo.append(y)
    return first


def best_ring(hosts: list[str], cap: dict[tuple[str, str], float]) -> list[int]:
    """Ring order with the largest bottleneck (brute force, n <= 9)."""
    best, order = -1.0, list(range(len(hosts)))
    for perm in itertools.permutations(range(1, len(hosts))):
        cyc = [0, *perm]
        if cyc[1] > cyc[-1]:
            continue
        bott = min(cap.get((hosts[a], hosts[b]), 0.0)
                   for a, b in zip(cyc, cyc[1:] + cyc[:1], strict=True))
        if bott > best:
            best, order = bott, cyc
    return order


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lab", required=True, metavar="CLUSTER", help="cluster file (direct)")
    ap.add_argument("--scale", type=float, default=0.25, help="cable rate factor (0.25)")
    ap.add_argument("--bytes", type=int, default=32 << 20, help="AllReduce size (32 MiB)")
    ap.add_argument("--iters", type=int, default=3, help="tree iterations (3)")
    ap.add_argument("--ring-iters", type=int, default=1, help="baseline iterations (1)")
    ap.add_argument("--chunk-bytes", type=int, default=None,
                    help="tree chunk (default: the cost model's choice)")
    ap.add_argument("--no-ring", action="store_true", help="skip the ring baseline")
    ap.add_argument("--name", default=f"tp5{os.getpid() % 100000}", help="lab name")
    ap.add_argument("--trees-only", action="store_true", help="skip the baselines (tuning)")
    ap.add_argument("--lookahead", type=int, default=None,
                    help="steps whose receives the tree runtime posts early (its default)")
    ap.add_argument("--plan", help="cable the lab as this plan's fabric and run its tree "
                    "schedule (a TopoOpt or trees plan of the cluster; --scale 1 only)")
    ap.add_argument("--json", help="write the raw results here")


def main(argv: list[str] | None = None) -> int:
    # usage errors exit 1 (bad input), not argparse's 2 (= changes, README "Exit codes")
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace, during=None) -> int:
    """Measure; ``during(ctx)`` (optional) runs while the lab is up, with ``ctx`` = {"lab",
    "hosts", "addr", "cables", "plan", "sched"}; the results are in ``args.result``."""
    from topoctl.lab.lab import Lab

    tmp = Path(tempfile.mkdtemp(prefix="tp5-bench-"))
    cfile = tmp / "cluster.yaml"
    cfile.write_text(yaml.safe_dump(scaled_cluster(Path(args.lab), args.scale, args.name)))
    t_up = time.perf_counter()
    plan_doc = yaml.safe_load(Path(args.plan).read_text()) if getattr(args, "plan", None) else None
    if plan_doc is not None and args.scale != 1:
        raise SystemExit("--plan: the plan's cables have their own rates; use --scale 1")
    sh([TOPOCTL, "lab", "up", str(cfile), "--name", args.name, "--no-ssh",
        *(["--plan", args.plan] if plan_doc is not None else [])])
    procs: list[subprocess.Popen] = []
    try:
        lab = Lab.load(args.name)
        hosts = [h.name for h in lab.layout.hosts]
        idx = {h: i for i, h in enumerate(hosts)}
        addr = {h: f"10.236.5.{i + 1}" for i, h in enumerate(hosts)}
        # fastest cable per host pair: (rate bit/s, port at a, port at b)
        cables: dict[tuple[str, str], tuple[int, str, str]] = {}
        for c in lab.layout.cables:
            (ha, pa), (hb, pb) = c.a.split(":"), c.b.split(":")
            key = (ha, hb) if idx[ha] < idx[hb] else (hb, ha)
            ports = (pa, pb) if key[0] == ha else (pb, pa)
            if key not in cables or cables[key][0] < c.rate:
                cables[key] = (c.rate, *ports)
        for h in hosts:
            ns = lab.netns(h)
            # no dummy driver in this kernel: a veth pair inside the host carries the address
            batch = ["link add tp5d0 type veth peer name tp5d1", "link set tp5d0 up",
                     "link set tp5d1 up",
                     f"addr add {addr[h]}/32 dev tp5d0"]
            port_to: dict[str, str] = {}
            for (a, b), (_, pa, pb) in cables.items():
                if h in (a, b):
                    peer, port = (b, pa) if h == a else (a, pb)
                    port_to[peer] = port
                    batch.append(f"route add {addr[peer]}/32 dev {port} src {addr[h]}")
            for dst, nh in first_hops(h, hosts, cables).items():  # not adjacent: via a host
                if dst not in port_to:
                    batch.append(f"route add {addr[dst]}/32 via {addr[nh]} dev {port_to[nh]} "
                                 f"onlink src {addr[h]}")
            sh(["ip", "-n", ns, "-batch", "-"], input="\n".join(batch) + "\n")
            for key in ("net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                        "net.ipv4.ip_forward=1"):
                sh(["ip", "netns", "exec", ns, "sysctl", "-qw", key])
        t_up = time.perf_counter() - t_up
        # plan on the cables' rates in bytes/s
        links = [(a, b, r / 8.0) for (a, b), (r, _, _) in cables.items()]
        g = build_capgraph(links, hosts)
        tau = partition_bound(g)[0]
        plan, _, sched, pred = trees_for(hosts, links, lab.layout.mtu, args.bytes,
                                         chunk_bytes=args.chunk_bytes)
        if plan_doc is not None:  # the plan's own trees and chunk instead
            from topocontract.schedule import TreeSchedule

            doc = plan_doc["job"]["collective"]["schedule"]
            if args.chunk_bytes:
                doc = doc | {"chunk_bytes": args.chunk_bytes}
            sched = TreeSchedule.model_validate(doc)
            pred = schedule_prediction(sched, hosts, links, lab.layout.mtu, args.bytes)
        spath = tmp / "schedule.yaml"
        spath.write_text(yaml.safe_dump(sched.dump(), sort_keys=False))
        capd = {}
        for a, b, c in links:
            capd[(a, b)] = capd[(b, a)] = c
        order = best_ring(hosts, capd)
        port = 29500 + os.getpid() % 1000
        for h in hosts:
            cmd = ["ip", "netns", "exec", lab.netns(h), "env", "GLOO_SOCKET_IFNAME=tp5d0",
                   PY, "-m", "topotrain.collectives.benchworker", "--rank", str(idx[h]),
                   "--world", str(len(hosts)), "--master", f"{addr[hosts[0]]}:{port}",
                   "--bytes", str(args.bytes), "--iters", str(args.iters),
                   "--ring-iters", str(args.ring_iters), "--schedule", str(spath),
                   "--ring-order", ",".join(map(str, order))]
            if args.trees_only:
                cmd.append("--trees-only")
            if getattr(args, "lookahead", None) is not None:
                cmd += ["--lookahead", str(args.lookahead)]
            if getattr(args, "no_ring", False):
                cmd.append("--no-ring")
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        outs = [p.communicate(timeout=900) for p in procs]
        for p, (_, err) in zip(procs, outs, strict=True):
            if p.returncode:
                print(err[-3000:], file=sys.stderr)
                raise SystemExit(f"a rank failed (exit {p.returncode})")
        res = json.loads(outs[0][0].strip().splitlines()[-1])
        if during is not None:
            res["during"] = during({"lab": lab, "hosts": hosts, "addr": addr,
                                    "cables": cables, "plan": plan, "sched": sched})
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        subprocess.run([TOPOCTL, "lab", "down", "--lab", args.name], capture_output=True)
    m = args.bytes
    t_opt = m / tau
    origin = " (the plan's)" if plan_doc is not None else ""
    print(f"cluster {args.lab} (rates x{args.scale}), {len(hosts)} ranks, M = {m / 2**20:.1f}"
          f" MiB, {len(sched.trees)} trees{origin} (packed-tree rate "
          f"{plan.rate * 8 / 1e6:.1f} Mbit/s, "
          f"tau {tau * 8 / 1e6:.1f} Mbit/s), optimum {t_opt:.3f} s; ring order {order}; "
          f"chunk {sched.chunk_bytes} B; trees predicted {pred.seconds:.3f} s (network "
          f"{pred.network_s:.3f}, CPU {pred.cpu_s:.3f}: the larger)")
    print("| method | median s | algbw MB/s | measured/optimal | vs gloo | bench CPU (cores) | "
          "machine busy |")
    print("|---|---|---|---|---|---|---|")
    first = next(iter(res["results"]))
    gloo = res["results"].get("gloo all_reduce (default)", res["results"][first])["median"]
    for name, r in res["results"].items():
        t = r["median"]
        print(f"| {name} | {t:.3f} | {m / t / 1e6:.2f} | {t_opt / t:.1%} | {gloo / t:.1f}x | "
              f"{r['bench_cores']:.2f} | {r['machine_busy']:.0%} |"
              + ("" if r["correct"] else " WRONG RESULT |"))
    print(f"load average {os.getloadavg()}; lab up + addressing {t_up:.1f} s")
    args.result = {"tau": tau, "optimum_s": t_opt, "plan_rate": plan.rate,
                   "trees": len(sched.trees), "chunk_bytes": sched.chunk_bytes,
                   "predicted": pred.as_dict(), "load_average": os.getloadavg(), **res}
    if args.json:
        Path(args.json).write_text(json.dumps(args.result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
