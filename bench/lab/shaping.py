"""Benchmark: shaping accuracy of lab cables. iperf3 (TCP goodput) through cables shaped at
50, 100 and 200 Mbit/s, with jumbo (9000) and standard (1500) frames; target: within 5%.

Usage (root): .venv/bin/python -m bench.lab.shaping [--runs 3] [--time 3]
One lab per MTU (6 hosts, 3 cables); cables are measured one at a time so they never share the
CPU; medians of achieved/configured per rate and MTU, with the sender's CPU use.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from topoctl.lab import lab as labmod
from topoctl.lab.measure import measure
from topoctl.spec.cluster_load import parse_cluster

RATES = ["50mbit", "100mbit", "200mbit"]


def cluster(mtu: int) -> dict:
    hosts = [{"name": f"h{i}", "nics": [{"name": "eth0"}]} for i in range(2 * len(RATES))]
    links = [{"a": f"h{2 * k}:eth0", "b": f"h{2 * k + 1}:eth0", "bandwidth": r}
             for k, r in enumerate(RATES)]
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "shape",
            "defaults": {"nic_speed": "1gbit"}, "hosts": hosts,
            "fabric": {"kind": "direct", "mtu": mtu, "links": links}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--time", type=float, default=3.0)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    name = f"bs{os.getpid() % 100000}"
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for mtu in (9000, 1500):
            try:
                lab = labmod.up(parse_cluster(cluster(mtu)), name, root, with_ssh=False)
                per: dict[str, list] = {}
                for _ in range(args.runs):
                    for r in measure(lab, seconds=args.time):
                        if r.error:
                            raise SystemExit(f"{r.name}: {r.error}")
                        per.setdefault(r.name, []).append(r)
            finally:
                labmod.down(name, root)
            for rs in per.values():
                ratio = statistics.median(r.ratio for r in rs)
                cpu = statistics.median(r.cpu_percent or 0 for r in rs)
                rows.append((mtu, rs[0].configured, statistics.median(r.achieved for r in rs),
                             ratio, cpu))
    print(f"{'mtu':>5} {'configured':>11} {'achieved':>10} {'ratio':>6} {'off':>6} {'cpu%':>5}")
    for mtu, conf, ach, ratio, cpu in rows:
        print(f"{mtu:>5} {conf / 1e6:>9.0f}M {ach / 1e6:>9.2f}M {ratio:>6.3f} "
              f"{(ratio - 1) * 100:>+5.1f}% {cpu:>5.1f}")
    print(f"median of {args.runs} runs x {args.time:g}s (+1s omitted slow start) per cable; "
          f"load avg {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
