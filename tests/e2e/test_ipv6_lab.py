"""A heterogeneous cluster once IPv6-only (the rollout tests' 4 hosts cut from the demo's
hetero8, tests/e2e/labs.py, with h0-h2 traffic forwarded): a lab of it, a plan with
`addressing.family: ipv6` (baseline+bandwidth: weighted multipath in a policy-routing table,
u32 QoS classes on IPv6 destinations, forwarding hosts), applied by the agents, and a few
training steps of the demo's MLP job over gloo between the hosts' IPv6 training addresses.

The controller reaches the hosts' sshd over the lab's IPv6 management addresses (an IPv6-only
lab), so the agent's management guard judges an IPv6 connection: a plan that would route the
controller's IPv6 address over the fabric is refused on that host, naming the connection.

Read back independently: `ip -j -6 addr/route/rule` in every host (the plan's addresses, none
tentative, a /128 route to every other host, no IPv4 but management and loopback), `tc -j
filter` (u32 on protocol ipv6), and `ss -tn` inside h0's namespace during the run: rank 0's
gloo and rendezvous connections go between IPv6 training addresses, none over IPv4. One lab,
one run: about half a minute on the 2-core machine, most of it four ranks importing torch."""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import time

import pytest
import yaml

from tests import netns as nsutil
from tests.e2e.labs import CLUSTER
from topoctl import cli
from topoctl.lab import lab as labmod
from topoctl.lab.layout import mgmt6
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

pytestmark = pytest.mark.netns

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINING6 = ipaddress.IPv6Network("fd74:6f70:6f63:1::/64")
# the demo's job (plans/mlp-job.yaml: the MLP of ~4M parameters, 384 samples a step) with
# the strategy that exercises the most IPv6 objects (weighted multipath in a policy table, u32
# classes on IPv6 destinations)
with open(os.path.join(ROOT, "plans", "mlp-job.yaml")) as f:
    JOB = yaml.safe_load(f) | {"strategies": ["baseline+bandwidth"],
                               "bandwidth": {"multipath": True}}
STEPS = 4  # seconds each on the cluster's cables: `ss` sees the connections


def cluster_ipv6():
    doc = yaml.safe_load(CLUSTER.read_text())
    doc["addressing"] = doc.get("addressing", {}) | {"family": "ipv6"}
    return parse_cluster(doc)


class Sockets:
    """`ss -tn` of established TCP connections inside one namespace, polled until stopped."""

    def __init__(self, ns: str):
        self.ns, self.seen = ns, set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self) -> None:
        while not self.stop.is_set():
            out = nsutil.ns_exec(self.ns, "ss", "-Htn", "state", "established",
                                 check=False).stdout
            for line in out.splitlines():
                f = line.split()
                if len(f) >= 4:
                    self.seen.add((f[-2], f[-1]))  # local, peer (addr:port, [v6]:port)
            time.sleep(0.1)


def host_of(endpoint: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address of `ss`'s `addr:port` / `[addr]:port`."""
    return ipaddress.ip_address(endpoint.rpartition(":")[0].strip("[]").split("%")[0])


def check_kernel_state(lab, plan: dict) -> None:
    """What the hosts' kernels hold after apply, read by iproute2 (not the agent)."""
    training = plan["metadata"]["addressing"]["training"]
    for h in lab.cluster.hosts:
        ns = lab.netns(h.name)
        v6 = nsutil.ip_json(ns, "-6", "addr", "show")
        mine = {(i["ifname"], f"{a['local']}/{a['prefixlen']}"): a for i in v6
                for a in i["addr_info"] if a.get("scope") == "global"}
        want = {(i["name"], x) for i in plan["hosts"][h.name]["interfaces"]
                for x in i["addresses"]}
        assert want <= set(mine), (h.name, want - set(mine))
        assert not [k for k, a in mine.items() if a.get("tentative") or a.get("dadfailed")]
        v4 = {a["local"] for i in nsutil.ip_json(ns, "-4", "addr", "show")
              for a in i["addr_info"]}
        assert v4 == {"127.0.0.1", lab.mgmt_ip(h.name)}, (h.name, v4)  # no IPv4 fabric
        assert f"{lab.layout.ssh_ip(h.name)}/{lab.layout.prefixlen6()}" in {
            f"{a['local']}/{a['prefixlen']}" for i in v6 for a in i["addr_info"]}
        routes = {r["dst"] for r in nsutil.ip_json(ns, "-6", "route", "show", "table", "all")}
        others = {f"{a}" for o, a in training.items() if o != h.name}
        assert others <= routes, (h.name, others - routes)  # /128 routes print bare


def refused_over_ipv6_management(lab, plan: dict, tmp_path, capsys) -> None:
    """A plan whose h0 routes the controller's IPv6 management address over the fabric is
    refused over SSH by h0's agent (the guard, from SSH_CONNECTION), and h0 is untouched."""
    client = mgmt6(lab.layout.gateway)
    bad = json.loads(json.dumps(plan))
    h0 = bad["hosts"]["h0"]
    hop = next(r for r in h0["routes"] if "via" in r)
    h0["routes"].append({"dst": f"{client}/128", "via": hop["via"], "dev": hop["dev"]})
    path = tmp_path / "cuts-management.yaml"
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    capsys.readouterr()
    assert cli.main(["apply", str(path), "--lab", lab.name, "--ssh"]) != 0
    out = capsys.readouterr()
    text = out.out + out.err
    server = lab.layout.ssh_ip("h0")
    assert f"the management connection {client} -> {server}" in text, text[-2000:]
    assert not [a for i in nsutil.ip_json(lab.netns("h0"), "-6", "addr", "show")
                for a in i["addr_info"] if a["local"].startswith("fd74:6f70:6f63:1:")]


def test_a_heterogeneous_cluster_trains_ipv6_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(tmp_path / "labs"))
    cluster = cluster_ipv6()
    plan, _, _ = make_plan(cluster, parse_job(JOB), use_cache=False)
    assert plan["metadata"]["addressing"]["family"] == "ipv6"
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    name = f"v6{os.getpid() % 10**6}"
    lab = labmod.up(cluster, name=name)
    try:
        refused_over_ipv6_management(lab, plan, tmp_path, capsys)
        assert cli.main(["apply", str(path), "--lab", name, "--ssh"]) == 0
        check_kernel_state(lab, plan)
        rules = [r for h in lab.cluster.hosts
                 for r in nsutil.ip_json(lab.netns(h.name), "-6", "rule", "show")
                 if r.get("table") not in ("local", "main", "default")]
        assert rules, "baseline+bandwidth's policy routing (IPv6 rules) is in no host"
        u32 = [f for h in lab.cluster.hosts for q in plan["hosts"][h.name].get("qos", [])
               for f in nsutil.tc_json(lab.netns(h.name), "filter", "show", "dev", q["dev"])
               if f.get("protocol") == "ipv6"]
        assert u32, "no u32 filter on an IPv6 destination"
        capsys.readouterr()
        socks = Sockets(lab.netns("h0"))
        socks.thread.start()
        try:
            code = cli.main(["run", str(path), "--lab", name, "--iterations", str(STEPS),
                             "--json", "--timeout", "300", "--ssh"])
        finally:
            socks.stop.set()
            socks.thread.join()
        result = json.loads(capsys.readouterr().out)
        assert code == 0, result.get("failure")
        assert result["synchronous"] is True
        assert sorted(result["ranks"]) == [str(r) for r in range(len(lab.cluster.hosts))]
        assert all(r["iterations"] == STEPS for r in result["ranks"].values())
        mgmt = {ipaddress.ip_address(lab.mgmt_ip("h0")),
                ipaddress.ip_address(lab.layout.ssh_ip("h0"))}  # the controller's SSH
        pairs = [(host_of(a), host_of(b)) for a, b in socks.seen]
        fabric = [(a, b) for a, b in pairs if not a.is_loopback and a not in mgmt]
        assert fabric, "ss saw no connection of rank 0's"
        assert all(a.version == 6 and a in TRAINING6 and b in TRAINING6 for a, b in fabric), \
            sorted(socks.seen)
        # gloo's full mesh (and the rendezvous store rank 0 serves): every other host
        own = ipaddress.ip_address(plan["metadata"]["addressing"]["training"]["h0"])
        assert len({b for _, b in fabric} - {own}) == len(lab.cluster.hosts) - 1, \
            sorted(socks.seen)
    finally:
        labmod.down(name)
