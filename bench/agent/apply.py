"""Benchmark: topo-agent on one namespace host with many routes, rules and HTB classes.

Workload (scale 1): 1,000 routes (a quarter weighted multipath over two next hops), 500 policy
rules, 256 HTB classes each with its u32 destination filter, on a host namespace wired to a
peer namespace that answers the probes. Measured per scale, `--repeat` times on fresh
namespaces: the first apply, a no-op re-apply, and a diff, through the library (what a
long-lived agent pays) and through the `topo-agent` CLI (adds interpreter start-up); and, as
the bound, `ip -batch` + `tc -batch` creating the same objects on fresh namespaces (no
observe, no journal, no verify: the kernel's cost plus iproute2's parsing). Prints medians.
Targets at scale 1: no-op re-apply and diff <= 0.3 s (issue 2); first apply <= 0.3 s at
scale 1 and <= 3 s at scale 10 (issue 38).

    python -m bench.agent.apply [--scales 1 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from topoagent.apply.store import Store
from topoagent.apply.transaction import apply_state, plan
from topoagent.state.host import parse_host_state
from topoagent.target import Target

NS, PEER = f"tpb-{os.getpid()}-host", f"tpb-{os.getpid()}-peer"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def make_hosts() -> None:
    sh("ip", "netns", "add", NS)
    sh("ip", "netns", "add", PEER)
    for i in (0, 1):
        sh("ip", "-n", NS, "link", "add", f"tpe{i}", "type", "veth", "peer", "name", f"tpf{i}",
           "netns", PEER)
        sh("ip", "-n", PEER, "addr", "add", f"10.231.{10 + i}.2/24", "dev", f"tpf{i}")
        sh("ip", "-n", PEER, "link", "set", f"tpf{i}", "up")


def drop_hosts() -> None:
    for ns in (NS, PEER):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def workload(scale: int) -> dict:
    n_routes, n_rules, n_classes = 1000 * scale, 500 * scale, 256 * scale
    routes = []
    for i in range(n_routes):
        dst = f"10.238.{i // 250}.{i % 250}/32"
        if i % 4 == 0:
            routes.append({"dst": dst, "table": 100 + i % 8, "nexthops": [
                {"via": "10.231.10.2", "dev": "tpe0", "weight": 1 + i % 3},
                {"via": "10.231.11.2", "dev": "tpe1", "weight": 1}]})
        else:
            routes.append({"dst": dst, "via": f"10.231.{10 + i % 2}.2", "table": 100 + i % 8})
    rules = [{"priority": 1000 + i, "from": f"10.238.{i // 250}.{i % 250}/32",
              "table": 100 + i % 8} for i in range(n_rules)]
    classes = [{"id": 2 + i, "dst": f"10.238.{i // 250}.{i % 250}/32", "rate": "1mbit",
                "ceil": "100mbit"} for i in range(n_classes)]
    return {
        "interfaces": [{"name": "tpe0", "addresses": ["10.231.10.1/24"], "up": True},
                       {"name": "tpe1", "addresses": ["10.231.11.1/24"], "up": True}],
        "sysctl": {"ip_forward": True},
        "routes": routes, "rules": rules,
        "qos": [{"dev": "tpe0", "rate": "10gbit", "classes": classes}],
    }


def batch_files(data: dict, tmp: Path) -> tuple[Path, Path]:
    """The workload as `ip -batch` and `tc -batch` input: the same objects the agent makes."""
    ip_lines = []
    for iface in data["interfaces"]:
        ip_lines.append(f"link set {iface['name']} up")
        ip_lines += [f"address add {a} dev {iface['name']}"
                     for a in iface["addresses"]]
    for r in data["routes"]:
        where = (" ".join(f"nexthop via {h['via']} dev {h['dev']} weight {h['weight']}"
                          for h in r["nexthops"]) if "nexthops" in r else f"via {r['via']}")
        ip_lines.append(f"route replace {r['dst']} table {r['table']} proto 76 {where}")
    ip_lines += [f"rule add priority {u['priority']} from {u['from']} table {u['table']} "
                 f"proto 76" for u in data["rules"]]
    q = data["qos"][0]
    dev = q["dev"]
    tc_lines = [f"qdisc add dev {dev} root handle 7470: htb default 0",
                f"class add dev {dev} parent 7470: classid 7470:1 htb rate {q['rate']} "
                f"ceil {q['rate']} burst 5000000 cburst 5000000"]
    for c in data["qos"][0]["classes"]:
        tc_lines.append(f"class replace dev {dev} parent 7470:1 classid 7470:{c['id']:x} htb "
                        f"rate {c['rate']} ceil {c['ceil']} burst 3028 cburst 50000")
        tc_lines.append(f"filter add dev {dev} parent 7470: protocol ip prio 10 "
                        f"handle 800::{c['id']:x} u32 match ip dst {c['dst']} "
                        f"flowid 7470:{c['id']:x}")
    ip_file, tc_file = tmp / "ip.batch", tmp / "tc.batch"
    ip_file.write_text("\n".join(ip_lines) + "\n")
    tc_file.write_text("\n".join(tc_lines) + "\n")
    return ip_file, tc_file


def ip_batch_once(scale: int, tmp: Path) -> float:
    """Seconds for `ip -batch` and `tc -batch` to create the workload on fresh namespaces."""
    tmp.mkdir(parents=True, exist_ok=True)
    ip_file, tc_file = batch_files(workload(scale), tmp)
    make_hosts()
    try:
        t = time.perf_counter()
        sh("ip", "-n", NS, "-batch", str(ip_file))
        sh("ip", "netns", "exec", NS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("tc", "-n", NS, "-batch", str(tc_file))
        return time.perf_counter() - t
    finally:
        drop_hosts()


def run_once(scale: int, tmp: Path) -> dict[str, float]:
    data = workload(scale)
    desired = parse_host_state(data)
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"state-{scale}.yaml"
    path.write_text(yaml.safe_dump(data))
    target = Target(netns=NS, state_dir=tmp / "store")
    out: dict[str, float] = {}
    make_hosts()
    try:
        t = time.perf_counter()
        r = apply_state(target, desired, store=Store(target.store_dir))
        out["first apply"] = time.perf_counter() - t
        assert r.changed, "workload did not apply"
        t = time.perf_counter()
        r = apply_state(target, desired, store=Store(target.store_dir))
        out["no-op re-apply"] = time.perf_counter() - t
        assert not r.changed
        t = time.perf_counter()
        _, ops = plan(target, desired)
        out["diff"] = time.perf_counter() - t
        assert not ops
        cli = [sys.executable, "-m", "topoagent.cli", "--netns", NS, "--state-dir",
               str(tmp / "store")]
        for label, args in (("cli no-op apply", ["apply", str(path)]),
                            ("cli diff", ["diff", str(path)])):
            t = time.perf_counter()
            rc = subprocess.run(cli + args, capture_output=True).returncode
            out[label] = time.perf_counter() - t
            assert rc == 0, f"{label}: exit {rc}"
    finally:
        drop_hosts()
    out["ip -batch (bound)"] = ip_batch_once(scale, tmp / "ipbatch")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print(f"{'scale':>5} {'routes':>7} {'rules':>6} {'classes':>7}  "
          + "  ".join(f"{k:>15}" for k in ("first apply", "no-op re-apply", "diff",
                                              "cli no-op apply", "cli diff",
                                              "ip -batch")))
    with tempfile.TemporaryDirectory() as tmpdir:
        for scale in args.scales:
            runs = [run_once(scale, Path(tmpdir) / f"{scale}-{k}") for k in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{scale:>5} {1000 * scale:>7} {500 * scale:>6} {256 * scale:>7}  "
                  + "  ".join(f"{med[k]:>14.3f}s" for k in med), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
