"""A weighted multipath route splits traffic by its weights only when the kernel hashes the
ports too (`sysctl.multipath_hash_policy: 1`): with the default (0, addresses only) every
connection between two hosts takes the same next hop.

Real kernel: a host namespace with two veth cables (tpa0, tpc0) to a peer namespace that holds
10.236.9.2/32 on lo; the agent applies a route to it with next hops weighted 3:1, and iperf3
picks a next hop per connection. The choice is read from the kernel's own route lookup for each
connection's 5-tuple (`ip route get ... sport dport`), real iperf3 traffic from the peer's
interface byte counters (`ip -s -j link`), the sysctl from /proc."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time

import pytest

from tests.integration.test_agent import Host
from tests.netns import ip_json, ns_exec, sh

pytestmark = pytest.mark.netns

DST, PORT = "10.236.9.2", 5311


@pytest.fixture
def two_cables(make_netns, tmp_path) -> Host:
    ns, peer = make_netns(), make_netns()
    for mine, theirs, net in (("tpa0", "tpb0", 1), ("tpc0", "tpd0", 3)):
        sh(["ip", "-n", ns, "link", "add", mine, "type", "veth", "peer", "name", theirs,
            "netns", peer])
        sh(["ip", "-n", peer, "addr", "add", f"10.231.{net}.2/24", "dev", theirs])
        sh(["ip", "-n", peer, "link", "set", theirs, "up"])
    sh(["ip", "-n", peer, "addr", "add", f"{DST}/32", "dev", "lo"])
    # the answers go back over one cable; the peer accepts requests on either
    sh(["ip", "-n", peer, "route", "add", "10.236.9.1/32", "via", "10.231.1.1"])
    for dev in ("all", "default", "tpb0", "tpd0"):
        ns_exec(peer, "sysctl", "-qw", f"net.ipv4.conf.{dev}.rp_filter=0")
    return Host(ns, peer, tmp_path / "state", tmp_path)


def state(policy: int | None) -> dict:
    doc: dict = {
        "interfaces": [
            {"name": "lo", "addresses": ["10.236.9.1/32"]},
            {"name": "tpa0", "addresses": ["10.231.1.1/24"], "up": True},
            {"name": "tpc0", "addresses": ["10.231.3.1/24"], "up": True},
        ],
        "routes": [{"dst": f"{DST}/32", "src": "10.236.9.1", "nexthops": [
            {"via": "10.231.1.2", "dev": "tpa0", "weight": 3},
            {"via": "10.231.3.2", "dev": "tpc0", "weight": 1}]}],
        "sysctl": {"rp_filter": {"tpa0": 2, "tpc0": 2}},
    }
    if policy is not None:
        doc["sysctl"]["multipath_hash_policy"] = policy
    return doc


def hash_policy(ns: str) -> str:
    return ns_exec(ns, "cat", "/proc/sys/net/ipv4/fib_multipath_hash_policy").stdout.strip()


@contextlib.contextmanager
def iperf_server(ns: str):
    p = subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-s", "-B", DST, "-p", str(PORT)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        yield
    finally:
        p.terminate()
        p.wait(10)


def chosen_devs(ns: str, ports: range) -> list[str]:
    """The next hop's device the kernel picks for a TCP connection from each source port
    (`ip route get ... ipproto tcp sport P dport PORT`: the route lookup with the flow's hash)."""
    return [ip_json(ns, "route", "get", DST, "from", "10.236.9.1", "ipproto", "tcp", "sport",
                    str(p), "dport", str(PORT))[0]["dev"] for p in ports]


def bytes_per_cable(h: Host) -> tuple[int, int]:
    """Bytes 16 iperf3 connections delivered over the peer's tpb0 (weight 3) and tpd0."""
    def rx() -> dict[str, int]:
        return {ln["ifname"]: ln["stats64"]["rx"]["bytes"]
                for ln in ip_json(h.peer, "-s", "link") if ln["ifname"] in ("tpb0", "tpd0")}

    r0 = rx()
    out = ns_exec(h.ns, "iperf3", "-c", DST, "-p", str(PORT), "-t", "1", "-P", "16", "-J",
                  "-B", "10.236.9.1")
    assert json.loads(out.stdout)["end"]["sum_received"]["bytes"] > 0
    r1 = rx()
    return r1["tpb0"] - r0["tpb0"], r1["tpd0"] - r0["tpd0"]


def test_l4_hash_splits_connections_by_weight(two_cables: Host):
    h = two_cables
    was = hash_policy(h.ns)
    ports = range(40000, 40400)
    assert h.apply(state(0)).returncode == 0
    assert hash_policy(h.ns) == "0"
    # addresses only: every connection between the two hosts takes the same next hop
    assert len(set(chosen_devs(h.ns, ports))) == 1
    r = h.apply(state(1))
    assert r.returncode == 0, r.stdout + r.stderr
    assert hash_policy(h.ns) == "1"
    assert h.apply(state(1)).returncode == 0  # in sync: no change
    # ports hashed too: 400 connections split by the weights, 3:1 (binomial sd 0.022)
    devs = chosen_devs(h.ns, ports)
    assert 0.65 <= devs.count("tpa0") / len(devs) <= 0.85, devs.count("tpa0")
    # and real traffic takes both cables (16 connections all on one: p = 0.75^16 = 1%, retried)
    with iperf_server(h.peer):
        for _attempt in range(3):
            b, d = bytes_per_cable(h)
            if min(b, d) >= 0.03 * (b + d):
                break
    assert min(b, d) >= 0.03 * (b + d), (b, d)
    # rollback restores the value the host had before the agent first set it
    r = h.agent("rollback")
    assert r.returncode == 0, r.stdout + r.stderr
    assert hash_policy(h.ns) == was


def test_a_state_that_no_longer_asks_for_the_hash_gets_the_original_back(two_cables: Host):
    """A state that set the L4 hash, then one that says nothing of it (the next plan on the same
    hosts): the host's original value comes back, as on a rollback; otherwise the next plan's
    connections keep hashing by port over parallel cables (the demo's plain trees after a
    +bandwidth plan: 1.83 s instead of 1.04 s in one run of three)."""
    h = two_cables
    was = hash_policy(h.ns)
    assert was == "0"
    r = h.apply(state(1))
    assert r.returncode == 0, r.stdout + r.stderr
    assert hash_policy(h.ns) == "1"
    r = h.apply(state(None))
    assert r.returncode == 0, r.stdout + r.stderr
    assert hash_policy(h.ns) == was
    assert h.apply(state(None)).returncode == 0  # in sync: no change


def test_out_of_range_policy_is_refused_naming_the_path(two_cables: Host):
    r = two_cables.apply(state(7))
    assert r.returncode == 1
    assert "sysctl.multipath_hash_policy" in r.stderr
    assert hash_policy(two_cables.ns) == "0"
