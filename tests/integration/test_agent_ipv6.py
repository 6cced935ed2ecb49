"""topo-agent with IPv6 and on mixed hosts, against the real kernel in throwaway namespaces.

Addresses with and without duplicate address detection (link-local left alone), routes and
weighted multipath next hops, policy rules, per-destination QoS classification (u32 on IPv6
destinations beside IPv4 ones), the forwarding and multipath-hash sysctls; apply, no-op,
change, rollback, recover after a kill, and the management guard for an IPv6 connection. Host
state is read with iproute2 (`ip -j -6`, `tc -j`) and /proc."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.integration.test_agent import Host, full_state, host  # noqa: F401
from tests.integration.test_agent import dump as dump4
from tests.integration.test_agent_batch import same_host
from tests.netns import ip_json, json_batch, ns_exec, sh, sysctl_lines, tc_json

pytestmark = pytest.mark.netns


def v6_state() -> dict:
    """An IPv6-only host: the peer (2001:db8:1::2) answers on tpa0; tpc0/tpd0 are a pair."""
    return {
        "interfaces": [
            {"name": "tpa0", "addresses": ["2001:db8:1::1/64"], "up": True, "dad": False},
            {"name": "tpc0", "addresses": ["2001:db8:3::1/64"], "up": True, "dad": False},
            {"name": "tpd0", "up": True},
            {"name": "lo", "addresses": ["2001:db8:9::1/128"]},
        ],
        "sysctl": {"ipv6_forwarding": True, "ipv6_multipath_hash_policy": 1},
        "routes": [
            {"dst": "2001:db8:9::2/128", "via": "2001:db8:1::2", "src": "2001:db8:9::1"},
            {"dst": "2001:db8:9::/64", "table": 100, "nexthops": [
                {"via": "2001:db8:1::2", "dev": "tpa0", "weight": 3},
                {"via": "2001:db8:3::2", "dev": "tpc0", "weight": 1}]},
            {"dst": "2001:db8:8::/64", "dev": "tpc0", "table": 1234567, "metric": 7},
            {"dst": "2001:db8:7::/64", "via": "fe80::2", "dev": "tpa0", "table": 100},
        ],
        "rules": [
            {"priority": 1000, "from": "2001:db8:9::1/128", "to": "2001:db8:9::/64",
             "table": 100},
            {"priority": 1001, "fwmark": 7, "iif": "tpa0", "table": 1234567,
             "family": "ipv6"},
        ],
        "qos": [{"dev": "tpa0", "rate": "200mbit", "classes": [
            {"dst": "2001:db8:9::2", "rate": "50mbit"},
            {"id": 40, "dst": "2001:db8:9::/64", "rate": "100mbit", "ceil": "150mbit"}]}],
    }


def mixed_state() -> dict:
    """Both families on one host, rules of both at the same priorities, classes of both."""
    s4, s6 = full_state(), v6_state()
    out = copy.deepcopy(s4)
    for a, b in zip(out["interfaces"], s6["interfaces"], strict=True):
        a["addresses"] = a.get("addresses", []) + b.get("addresses", [])
        if "dad" in b:
            a["dad"] = b["dad"]
    out["sysctl"].update(s6["sysctl"])
    out["routes"] += s6["routes"][:2] + [dict(s6["routes"][2], table=100)]
    out["rules"] += s6["rules"]
    out["qos"][0]["classes"] += [dict(c, id=50 + k) for k, c in
                                 enumerate(s6["qos"][0]["classes"])]
    out["qos"][0]["rate"] = "400mbit"
    return out


@pytest.fixture
def host6(host: Host) -> Host:  # noqa: F811
    sh(["ip", "-n", host.peer, "addr", "add", "2001:db8:1::2/64", "dev", "tpb0", "nodad"])
    return host


def dump6(ns: str) -> dict:
    """The IPv6 half of a host dump (tests.netns.host_dump reads IPv4), as iproute2 and /proc
    report it, without what the kernel makes by itself and on its own schedule (link-local
    addresses and their routes, which appear once a link is up, and the local table)."""
    addr6, route6, rule6 = json_batch("ip", ns, ["-6"], ["addr show", "route show table all",
                                                          "rule show"])
    # a link is listed once it has any IPv6 address: with only its link-local one, it is not
    # listed here either
    addrs = [{"ifname": a["ifname"], "addr_info": kept}
             for a in addr6
             if (kept := sorted((i["local"], i["prefixlen"]) for i in a.get("addr_info", [])
                                if not i["local"].startswith("fe80:")))]
    routes = [r for r in route6
              if r.get("table") != "local" and not r["dst"].startswith("fe80:")]
    for r in routes:
        r.pop("pref", None)
        r.pop("expires", None)
    sysctl = sysctl_lines(ns, ["/proc/sys/net/ipv6/conf/all/forwarding",
                               "/proc/sys/net/ipv6/fib_multipath_hash_policy"])
    return {"addr6": addrs, "route6": routes, "rule6": rule6, "sysctl6": sysctl}


def dump(ns: str) -> dict:  # noqa: F811
    """Both families: tests.netns.host_dump's IPv4 and tc, and dump6."""
    return {**dump4(ns), **dump6(ns)}


def agent_env(h: Host, env: dict, *args: str, stdin: str) -> subprocess.CompletedProcess:
    """The agent's CLI on `h` with extra environment (the test-only crash switch)."""
    cmd = [sys.executable, "-m", "topoagent.cli", "--netns", h.ns, "--state-dir",
           str(h.state_dir), *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def u32_ipv6(ns: str, dev: str) -> list[tuple[str, str]]:
    """(flowid, matched destination words) of the IPv6 u32 filters of `dev`, read by tc."""
    out = []
    for f in tc_json(ns, "filter", "show", "dev", dev):
        opts = f.get("options", {})
        if f.get("protocol") == "ipv6" and "flowid" in opts:
            out.append((opts["flowid"], f["pref"]))
    return sorted(out)


def test_ipv6_only_host_applies_is_seen_by_iproute2_and_reapplies_as_a_noop(host6: Host):
    r = host6.apply(v6_state())
    assert r.returncode == 0, r.stderr
    addrs = {(a["ifname"], i["local"], i["prefixlen"]) for a in ip_json(host6.ns, "-6", "addr")
             for i in a["addr_info"]}
    assert {("tpa0", "2001:db8:1::1", 64), ("tpc0", "2001:db8:3::1", 64),
            ("lo", "2001:db8:9::1", 128)} <= addrs
    # dad: false -> not tentative; the kernel's link-local addresses are still there
    flags = {i["local"]: i for a in ip_json(host6.ns, "-6", "addr") for i in a["addr_info"]}
    assert not flags["2001:db8:1::1"].get("tentative")
    assert any(a.startswith("fe80::") for a in flags)
    mp = ip_json(host6.ns, "-6", "route", "show", "table", "100", "2001:db8:9::/64")
    assert len(mp) == 1 and mp[0]["protocol"] == "76"
    assert sorted((h["gateway"], h["dev"], h["weight"]) for h in mp[0]["nexthops"]) == [
        ("2001:db8:1::2", "tpa0", 3), ("2001:db8:3::2", "tpc0", 1)]
    main = {r["dst"]: r for r in ip_json(host6.ns, "-6", "route", "show")}
    assert main["2001:db8:9::2"]["gateway"] == "2001:db8:1::2"
    assert main["2001:db8:9::2"]["prefsrc"] == "2001:db8:9::1"
    ll = ip_json(host6.ns, "-6", "route", "show", "table", "100", "2001:db8:7::/64")
    assert ll[0]["gateway"] == "fe80::2" and ll[0]["dev"] == "tpa0"
    rules = {r["priority"]: r for r in ip_json(host6.ns, "-6", "rule", "show")}
    assert rules[1000]["src"] == "2001:db8:9::1" and rules[1000]["dst"] == "2001:db8:9::"
    assert rules[1001]["fwmark"] == "0x7" and rules[1001]["table"] == "1234567"
    assert not [r for r in ip_json(host6.ns, "-4", "rule", "show") if r["priority"] in
                (1000, 1001)]
    assert u32_ipv6(host6.ns, "tpa0") == [("7470:2", 11), ("7470:28", 11)]
    proc = "/proc/sys/net/ipv6/"
    assert ns_exec(host6.ns, "cat", proc + "conf/all/forwarding").stdout.strip() == "1"
    assert ns_exec(host6.ns, "cat", proc + "fib_multipath_hash_policy").stdout.strip() == "1"
    # traffic: the peer answers on the applied address (no detection to wait for)
    assert ns_exec(host6.ns, "ping", "-6", "-c1", "-W2", "2001:db8:1::2",
                   check=False).returncode == 0

    after = dump(host6.ns)
    assert host6.diff(v6_state()).returncode == 0
    again = host6.apply(v6_state())
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert dump(host6.ns) == after
    shown = host6.agent("show")
    assert shown.returncode == 0
    assert host6.diff(shown.stdout).returncode == 0


def test_mixed_host_changes_and_rolls_back_both_families(host6: Host):
    assert host6.apply(full_state()).returncode == 0
    original = dump(host6.ns)
    r = host6.apply(mixed_state())
    assert r.returncode == 0, r.stderr
    fams = {r["priority"]: set() for r in ip_json(host6.ns, "rule", "show")}
    for fam in ("-4", "-6"):
        for rule in ip_json(host6.ns, fam, "rule", "show"):
            fams[rule["priority"]].add(fam)
    assert fams[1000] == {"-4", "-6"} and fams[1001] == {"-4", "-6"}
    flows = {f["options"]["flowid"]: f["protocol"]
             for f in tc_json(host6.ns, "filter", "show", "dev", "tpa0")
             if "flowid" in f.get("options", {})}
    assert flows == {"7470:2": "ip", "7470:28": "ip", "7470:32": "ipv6", "7470:33": "ipv6"}
    assert host6.diff(mixed_state()).returncode == 0
    # change: IPv6 weights and an address move, an IPv6 class goes, an IPv4 one stays
    changed = mixed_state()
    changed["routes"][4]["nexthops"][0]["weight"] = 1
    changed["interfaces"][1]["addresses"] = ["10.231.3.1/24", "2001:db8:3::5/64"]
    changed["qos"][0]["classes"].pop()
    r = host6.apply(changed)
    assert r.returncode == 0, r.stderr
    assert host6.diff(changed).returncode == 0
    assert u32_ipv6(host6.ns, "tpa0") == [("7470:32", 11)]
    for _ in range(2):
        back = host6.agent("rollback")
        assert back.returncode == 0, back.stderr
    # (tc lists HTB classes in hash order, and the hash grew with the classes: read as sets)
    assert same_host(dump(host6.ns), original)
    # no IPv6 object of the agent's is left (the kernel's own link-local routes come and go
    # with addrconf, so the whole table is not compared)
    assert not [r for r in ip_json(host6.ns, "-6", "route", "show", "table", "all")
                if r.get("protocol") == "76"]
    assert not [i for a in ip_json(host6.ns, "-6", "addr") for i in a["addr_info"]
                if i["local"].startswith("2001:db8:")]
    assert not [r for r in ip_json(host6.ns, "-6", "rule", "show") if r.get("protocol") == "76"]


def test_kill_mid_apply_recovers_ipv6(host6: Host):
    assert host6.apply(full_state()).returncode == 0
    original = dump(host6.ns)
    ops = len(json.loads(host6.agent("--json", "diff", "-",
                                     stdin=yaml.safe_dump(mixed_state())).stdout)["operations"])
    assert ops > 15
    for k in (3, ops // 2, ops):
        r = agent_env(host6, {"TOPO_AGENT_CRASH_AFTER": str(k)}, "apply", "--no-probe", "-",
                      stdin=yaml.safe_dump(mixed_state()))
        assert r.returncode == -9, (k, r.stderr)
        rec = host6.agent("recover")
        assert rec.returncode == 0 and "host is as before" in rec.stderr, (k, rec.stderr)
        assert same_host(dump(host6.ns), original), k


@pytest.mark.parametrize("change,path,message", [
    (lambda s: s["routes"].append({"dst": "10.9.0.0/16", "via": "2001:db8:1::2"}),
     "routes[4].via", "an IPv6 next hop on an IPv4 route"),
    (lambda s: s["routes"].append({"dst": "2001:db8:5::/64", "nexthops": [
        {"via": "2001:db8:1::2"}, {"via": "10.231.1.2"}]}),
     "routes[4].nexthops[1].via", "an IPv4 next hop on an IPv6 route"),
    (lambda s: s["routes"].append({"dst": "2001:db8:5::/129", "dev": "tpa0"}),
     "routes[4].dst", "over /128"),
    (lambda s: s["interfaces"][0]["addresses"].append("2001:db8:1::9/129"),
     "interfaces[0].addresses[1]", "over /128"),
    (lambda s: s["routes"].append({"dst": "2001:db8:5::/64", "via": "fe80::1"}),
     "routes[4].via", "link-local next hop fe80::1 needs dev"),
    (lambda s: s["interfaces"][0]["addresses"].append("fe80::7/64"),
     "interfaces[0].addresses[1]", "link-local"),
    (lambda s: s["rules"].append({"priority": 1005, "from": "10.0.0.0/8", "family": "ipv6",
                                  "table": 5}),
     "rules[2].from", "an IPv4 network in an ipv6 rule"),
    (lambda s: s["routes"].append({"dst": "2001:db8:5::/64", "via": "2001:db8:77::1"}),
     "routes[4].via", "gateway 2001:db8:77::1 is not on any link"),
])
def test_bad_ipv6_input_names_the_yaml_path_and_leaves_the_host(host6: Host, change, path,
                                                                 message):
    assert host6.apply(v6_state()).returncode == 0
    before = dump(host6.ns)
    state = v6_state()
    change(state)
    r = host6.apply(state)
    assert r.returncode == 1, r.stdout
    assert f"{path}: " in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert dump(host6.ns) == before


def test_mgmt_guard_protects_an_ipv6_connection(host6: Host):
    assert host6.apply(v6_state()).returncode == 0
    state = v6_state()
    state["interfaces"][0]["addresses"] = ["2001:db8:1::7/64"]  # the server address goes
    r = host6.agent("--mgmt", "2001:db8:1::2,2001:db8:1::1", "apply", "-",
                    stdin=yaml.safe_dump(state))
    assert r.returncode == 1 and "management connection 2001:db8:1::2" in r.stderr, r.stderr
    state = v6_state()
    state["qos"][0]["classes"][0] = {"dst": "2001:db8:1::/64", "rate": "1mbit"}
    r = host6.agent("--mgmt", "2001:db8:1::2,2001:db8:1::1", "apply", "-",
                    stdin=yaml.safe_dump(state))
    assert r.returncode == 1 and "qos[0].classes[0].rate" in r.stderr, r.stderr
