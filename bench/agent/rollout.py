"""Benchmark: `topoctl apply` of a whole lab plan, first apply and no-op re-apply.

A degree-4 direct-connect lab of N hosts (a ring plus stride-N/4 chords, 200 Mbit/s cables)
and a synthetic plan in which every host has ~100 routes (a quarter weighted multipath), 50
policy rules and 32 per-destination HTB classes: the size of a per-job plan on a large host.
Both phases of the rollout run (prepare on every host, then apply), through the lab transport
(one agent process per host and phase, as over SSH). Targets (issue 6, 32 hosts): first apply
<= 30 s, no-op re-apply <= 10 s.

    python -m bench.agent.rollout [--hosts 8 16 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import tempfile
import time
from pathlib import Path

from topoagent.state.host import parse_host_state
from topoctl.lab import lab as labmod
from topoctl.rollout import twophase as rollout
from topoctl.rollout.transports.local import lab_transport
from topoctl.spec.cluster_load import parse_cluster

ROUTES, RULES, CLASSES = 100, 50, 32


def cluster(n: int) -> dict:
    stride = max(2, n // 4)
    links = [{"a": f"h{i}:eth0", "b": f"h{(i + 1) % n}:eth1", "bandwidth": "200mbit"}
             for i in range(n)]
    links += [{"a": f"h{i}:eth2", "b": f"h{(i + stride) % n}:eth3", "bandwidth": "100mbit"}
              for i in range(n)]
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"bench{n}",
            "defaults": {"nic_speed": "200mbit", "gpus": {"count": 1, "type": "cpu"}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": f"eth{k}"} for k in range(4)]}
                      for i in range(n)],
            "fabric": {"kind": "direct", "links": links}}


def plan(c: dict) -> dict:
    """Per cable a /31; per host a training /32 on lo; routes to every other host's training
    address (and synthetic extra prefixes up to ROUTES), rules and QoS classes."""
    nets = ipaddress.IPv4Network("10.234.0.0/16").subnets(new_prefix=31)
    ports: dict[str, list[tuple[str, str, str]]] = {h["name"]: [] for h in c["hosts"]}
    for link in c["fabric"]["links"]:
        (ha, pa), (hb, pb) = link["a"].split(":"), link["b"].split(":")
        net = next(nets)
        a, b = str(net[0]), str(net[1])
        ports[ha].append((pa, f"{a}/31", b))
        ports[hb].append((pb, f"{b}/31", a))
    hosts = {}
    for i, h in enumerate(sorted(ports, key=lambda s: int(s[1:]))):
        mine = ports[h]
        routes = []
        for k in range(ROUTES):
            dst = f"10.236.{k // 250}.{k % 250 + 1}/32" if k != i else f"10.237.0.{k}/32"
            hops = [mine[k % len(mine)], mine[(k + 1) % len(mine)]]
            if k % 4 == 0:
                routes.append({"dst": dst, "nexthops": [
                    {"via": hops[0][2], "dev": hops[0][0], "weight": 2},
                    {"via": hops[1][2], "dev": hops[1][0], "weight": 1}]})
            else:
                routes.append({"dst": dst, "via": hops[0][2], "dev": hops[0][0],
                               "table": 100 + k % 4})
        rules = [{"priority": 1000 + k, "to": f"10.236.{k // 250}.{k % 250 + 1}/32",
                  "table": 100 + k % 4} for k in range(RULES)]
        classes = [{"id": 2 + k, "dst": f"10.236.{k // 250}.{k % 250 + 1}/32",
                    "rate": "2mbit", "ceil": "200mbit"} for k in range(CLASSES)]
        state = {"interfaces": [{"name": p, "addresses": [a], "up": True} for p, a, _ in mine]
                 + [{"name": "lo", "addresses": [f"10.237.1.{i + 1}/32"], "up": True}],
                 "sysctl": {"ip_forward": True, "rp_filter": {"all": 0}},
                 "routes": routes, "rules": rules,
                 "qos": [{"dev": mine[0][0], "rate": "200mbit", "classes": classes}]}
        parse_host_state(state, prefix=f"hosts.{h}")  # the bench must feed valid states
        hosts[h] = state
    return {"apiVersion": "topoctl/v1", "kind": "Plan", "metadata": {"cluster": c["name"]},
            "fabric": c["fabric"], "hosts": hosts, "job": {"processes": {}}}


def run_once(n: int, root: Path) -> dict[str, float]:
    os.environ["TOPOCTL_LAB_DIR"] = str(root)
    c = cluster(n)
    name = f"pb{os.getpid() % 10**5}"
    out: dict[str, float] = {}
    t = time.perf_counter()
    lab = labmod.up(parse_cluster(c), name=name, with_ssh=False)
    out["lab up"] = time.perf_counter() - t
    try:
        doc = plan(c)
        transport = lab_transport(lab)
        for label, code in (("first apply", 2), ("no-op re-apply", 0)):
            t = time.perf_counter()
            report = rollout.apply_plan(doc, transport)
            out[label] = time.perf_counter() - t
            assert report.exit_code == code, (label, report.message)
    finally:
        labmod.down(name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; per host "
          f"{ROUTES} routes, {RULES} rules, {CLASSES} classes")
    print(f"{'hosts':>5}  {'first apply':>12}  {'no-op re-apply':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.hosts:
            runs = [run_once(n, Path(tmp)) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{n:>5}  {med['first apply']:>11.2f}s  {med['no-op re-apply']:>13.2f}s",
                  flush=True)


if __name__ == "__main__":
    main()
