"""topo-agent against the real kernel, in throwaway namespaces, through its real CLI.

Every assertion about host state reads it with iproute2 (`ip -j`, `tc -j`) or /proc, not with
the agent's own observer. The host namespace has a veth to a peer namespace (10.231.1.0/24, the
peer answers pings) and a veth pair whose both ends stay inside the host (10.231.3.0/24)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.integration.forkagent import ForkAgent
from tests.netns import host_dump, ip_json, ns_exec, sh, tc_classes, tc_json

pytestmark = pytest.mark.netns

LINKS = ("tpa0", "tpc0", "tpd0", "lo")


@dataclass
class Host:
    """A namespace with its peer and the agent's state directory. `agent` runs `topo-agent` on
    it: a process of its own, `python -m topoagent.cli`, or, when `fork` is set, a child the
    module's fork server (tests.integration.forkagent) forks with this process's environment:
    the same `topoagent.cli.main` in a real process, without an interpreter's start-up and the
    agent's imports each call (most of a short call's CPU)."""

    ns: str
    peer: str
    state_dir: Path
    tmp: Path
    fork: ForkAgent | None = None

    def agent(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        argv = ["--netns", self.ns, "--state-dir", str(self.state_dir), *args]
        if self.fork is not None:
            return self.fork.run(argv, stdin=stdin, environ=dict(os.environ), timeout=120)
        cmd = [sys.executable, "-m", "topoagent.cli", *argv]
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)

    def apply(self, state: dict | str, *extra: str) -> subprocess.CompletedProcess:
        text = state if isinstance(state, str) else yaml.safe_dump(state)
        return self.agent("apply", "-", *extra, stdin=text)

    def diff(self, state: dict | str) -> subprocess.CompletedProcess:
        text = state if isinstance(state, str) else yaml.safe_dump(state)
        return self.agent("diff", "-", stdin=text)


def dump(ns: str) -> dict:
    return host_dump(ns, LINKS)


@pytest.fixture
def host(make_netns, tmp_path, agent_fork) -> Host:
    ns, peer = make_netns(), make_netns()
    sh(["ip", "-n", ns, "link", "add", "tpa0", "type", "veth", "peer", "name", "tpb0",
        "netns", peer])
    sh(["ip", "-n", peer, "addr", "add", "10.231.1.2/24", "dev", "tpb0"])
    sh(["ip", "-n", peer, "link", "set", "tpb0", "up"])
    sh(["ip", "-n", ns, "link", "add", "tpc0", "type", "veth", "peer", "name", "tpd0"])
    return Host(ns, peer, tmp_path / "state", tmp_path, agent_fork)


def full_state() -> dict:
    return {
        "interfaces": [
            {"name": "tpa0", "addresses": ["10.231.1.1/24"], "up": True},
            {"name": "tpc0", "addresses": ["10.231.3.1/24"], "up": True, "mtu": 9000},
            {"name": "tpd0", "up": True},
            {"name": "lo", "addresses": ["10.236.9.1/32"]},
        ],
        "sysctl": {"ip_forward": True, "rp_filter": {"all": 0, "tpa0": 2}},
        "routes": [
            {"dst": "10.236.9.2/32", "via": "10.231.1.2", "src": "10.236.9.1"},
            {"dst": "10.236.9.0/24", "table": 100, "nexthops": [
                {"via": "10.231.1.2", "dev": "tpa0", "weight": 3},
                {"via": "10.231.3.2", "dev": "tpc0", "weight": 1}]},
            {"dst": "10.236.8.0/24", "dev": "tpc0", "table": 1234567},
        ],
        "rules": [
            {"priority": 1000, "from": "10.236.9.1/32", "to": "10.236.9.0/24", "table": 100},
            {"priority": 1001, "fwmark": 7, "iif": "tpa0", "table": 1234567},
        ],
        "qos": [{"dev": "tpa0", "rate": "200mbit", "classes": [
            {"dst": "10.236.9.2", "rate": "50mbit"},
            {"id": 40, "dst": "10.236.9.0/24", "rate": "100mbit", "ceil": "150mbit"}]}],
    }


def test_apply_is_seen_by_iproute2_and_reapply_is_a_noop(host: Host):
    r = host.apply(full_state())
    assert r.returncode == 0, r.stderr
    addrs = {(a["ifname"], i["local"], i["prefixlen"])
             for a in ip_json(host.ns, "-4", "addr", "show") for i in a["addr_info"]}
    assert {("tpa0", "10.231.1.1", 24), ("tpc0", "10.231.3.1", 24),
            ("lo", "10.236.9.1", 32)} <= addrs
    link = {entry["ifname"]: entry for entry in ip_json(host.ns, "link", "show")}
    assert link["tpc0"]["mtu"] == 9000 and "UP" in link["tpa0"]["flags"]

    mp = ip_json(host.ns, "-4", "route", "show", "table", "100")
    assert len(mp) == 1 and mp[0]["protocol"] == "76"
    assert sorted((h["gateway"], h["dev"], h["weight"]) for h in mp[0]["nexthops"]) == [
        ("10.231.1.2", "tpa0", 3), ("10.231.3.2", "tpc0", 1)]
    main = {r["dst"]: r for r in ip_json(host.ns, "-4", "route", "show")}
    assert main["10.236.9.2"]["gateway"] == "10.231.1.2"
    assert main["10.236.9.2"]["prefsrc"] == "10.236.9.1"
    assert ip_json(host.ns, "-4", "route", "show", "table", "1234567")[0]["dst"] == "10.236.8.0/24"

    rules = {r["priority"]: r for r in ip_json(host.ns, "-4", "rule", "show")}
    assert rules[1000]["src"] == "10.236.9.1" and rules[1000]["dst"] == "10.236.9.0"
    assert rules[1000]["table"] == "100"
    assert rules[1001]["fwmark"] == "0x7" and rules[1001]["iif"] == "tpa0"

    classes = {c["handle"]: c for c in tc_classes(host.ns, "tpa0")}
    assert classes["7470:2"]["rate"] == 50_000_000 and classes["7470:2"]["ceil"] == 200_000_000
    assert classes["7470:28"]["rate"] == 100_000_000  # id 40 = 0x28
    assert classes["7470:28"]["ceil"] == 150_000_000
    # token credit: 4 ms at the rate (tc stores it as a transmit time: a few bytes' rounding),
    # at least two frames (tpa0: MTU 1500); pyroute2's default of 1600 bytes starved jumbo
    # frames
    for handle, burst, cburst in (("7470:1", 100_000, 100_000), ("7470:2", 25_000, 100_000),
                                  ("7470:28", 50_000, 75_000)):
        assert abs(classes[handle]["burst"] - burst) <= 0.01 * burst, classes[handle]
        assert abs(classes[handle]["cburst"] - cburst) <= 0.01 * cburst, classes[handle]
    filters = [f["options"] for f in tc_json(host.ns, "filter", "show", "dev", "tpa0")
               if "match" in f.get("options", {})]
    assert sorted((f["flowid"], f["match"]["value"], f["match"]["mask"]) for f in filters) == [
        ("7470:2", "aec0902", "ffffffff"), ("7470:28", "aec0900", "ffffff00")]
    assert ns_exec(host.ns, "cat", "/proc/sys/net/ipv4/ip_forward").stdout.strip() == "1"
    assert ns_exec(host.ns, "cat", "/proc/sys/net/ipv4/conf/tpa0/rp_filter").stdout.strip() == "2"

    after = dump(host.ns)
    assert host.diff(full_state()).returncode == 0
    again = host.apply(full_state())
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert dump(host.ns) == after


def test_show_feeds_back_to_diff_with_nothing_to_do(host: Host):
    assert host.apply(full_state()).returncode == 0
    shown = host.agent("show")
    assert shown.returncode == 0
    assert "10.231.1.1/24" in shown.stdout
    r = host.diff(shown.stdout)
    assert r.returncode == 0, r.stdout + r.stderr


def test_diff_json_lists_typed_operations(host: Host):
    r = host.agent("--json", "diff", "-", stdin=yaml.safe_dump(full_state()))
    assert r.returncode == 0
    out = json.loads(r.stdout)
    kinds = [op["op"] for op in out["operations"]]
    assert kinds.index("AddAddress") < kinds.index("SetRoute") < kinds.index("AddFilter")
    assert out["changes"] == len(kinds) and dump(host.ns)["route"] == dump(host.ns)["route"]


BAD_INPUTS = {
    "malformed": ("routes: [\n", "malformed YAML"),
    "unknown key": ("interfaces:\n  - {name: tpa0, speed: 10}\n", "interfaces[0].speed"),
    "wrong type": ("interfaces:\n  - {name: tpa0, mtu: big}\n", "interfaces[0].mtu"),
    "bad address": ("routes:\n  - {dst: 10.236.1.0/24, via: 10.231.1.999}\n", "routes[0].via"),
    "gateway not on a link": (
        "interfaces:\n  - {name: tpa0, addresses: [10.231.1.1/24], up: true}\n"
        "routes:\n  - {dst: 10.236.1.0/24, via: 10.231.1.2}\n"
        "  - dst: 10.236.2.0/24\n    nexthops:\n      - {via: 10.231.1.2}\n"
        "      - {via: 10.231.77.1}\n",
        "routes[1].nexthops[1].via: gateway 10.231.77.1 is not on any link"),
    "duplicate rule priority": (
        "rules:\n  - {priority: 1500, table: 10}\n"
        "  - {priority: 1500, to: 10.0.0.0/8, table: 11}\n",
        "rules[1]: same priority as rules[0]"),
    "class rates above the link rate": (
        "qos:\n  - dev: tpa0\n    rate: 100mbit\n    classes:\n"
        "      - {dst: 10.236.0.2, rate: 70mbit}\n      - {dst: 10.236.0.3, rate: 40mbit}\n",
        "qos[0]: classes: rates sum to 110mbit, above the link rate 100mbit"),
    "missing link": ("interfaces:\n  - {name: tpz9, up: true}\n",
                     "interfaces[0].name: no such link"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_errors_and_leaves_host_untouched(host: Host, case: str):
    assert host.apply(full_state()).returncode == 0  # a non-trivial host to protect
    before = dump(host.ns)
    text, message = BAD_INPUTS[case]
    # the bad part comes after plenty of valid changes, so nothing may be done "on the way"
    for args in (("apply", "-"), ("diff", "-"), ("apply", "--dry-run", "-")):
        r = host.agent(*args, stdin=text)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert message in r.stderr, r.stderr
    assert dump(host.ns) == before


def test_kernel_rejection_mid_apply_reverts_exactly(host: Host):
    assert host.apply(full_state()).returncode == 0
    before = dump(host.ns)
    bad = full_state()
    bad["sysctl"] = {"ip_forward": False, "rp_filter": {"all": 1}}
    bad["interfaces"][1]["mtu"] = 1400
    bad["interfaces"][0]["addresses"] = ["10.231.1.7/24"]
    bad["rules"] = bad["rules"][:1]
    bad["qos"][0]["classes"] = bad["qos"][0]["classes"][:1]
    # the kernel refuses a preferred source the host does not own; the schema cannot know
    bad["routes"].append({"dst": "10.236.7.0/24", "via": "10.231.1.2", "src": "10.231.99.99"})
    r = host.apply(bad)
    assert r.returncode == 1
    assert "10.236.7.0/24" in r.stderr and "reverted" in r.stderr
    assert dump(host.ns) == before


def test_foreign_objects_survive_apply_diff_and_rollback(host: Host):
    ns = host.ns
    sh(["ip", "-n", ns, "link", "set", "tpd0", "up"])
    sh(["ip", "-n", ns, "addr", "add", "10.231.4.1/24", "dev", "tpd0"])
    sh(["ip", "-n", ns, "route", "add", "10.236.50.0/24", "via", "10.231.4.9", "proto", "static"])
    sh(["ip", "-n", ns, "route", "add", "10.236.51.0/24", "dev", "tpd0", "table", "100"])
    sh(["ip", "-n", ns, "rule", "add", "priority", "1500", "to", "10.236.50.0/24", "table", "50"])
    sh(["ip", "-n", ns, "rule", "add", "priority", "5000", "fwmark", "9", "table", "51"])
    sh(["tc", "-n", ns, "qdisc", "add", "dev", "tpd0", "root", "handle", "5:", "tbf", "rate",
        "10mbit", "burst", "32kbit", "latency", "50ms"])
    foreign = dump(ns)

    def still_there():
        now = dump(ns)
        for key in ("route", "rule"):
            missing = [x for x in foreign[key] if x not in now[key]]
            assert not missing, (key, missing)
        assert now["tc tpd0"][0] == foreign["tc tpd0"][0]
        assert any(a["ifname"] == "tpd0" for a in now["addr"])

    state = full_state()
    state["interfaces"] = [i for i in state["interfaces"] if i["name"] != "tpd0"]
    assert host.apply(state, "--detailed-exitcode").returncode == 2
    still_there()
    assert host.diff(state).returncode == 0
    smaller = dict(state, rules=[], routes=state["routes"][:1], qos=[])
    assert host.apply(smaller, "--detailed-exitcode").returncode == 2
    still_there()
    assert host.apply({}).returncode == 1  # an empty state must say so
    still_there()
    # deletes every object the agent made, nothing else
    assert host.apply({}, "--allow-empty", "--detailed-exitcode").returncode == 2
    still_there()
    assert host.agent("rollback", "--detailed-exitcode").returncode == 2
    still_there()
    assert host.agent("rollback", "--detailed-exitcode").returncode == 2
    still_there()


def test_htb_credit_at_a_jumbo_mtu_and_the_lowest_rate(host: Host):
    """Two jumbo frames of credit where 4 ms of the rate is less; at 1 kbit/s at most 30 s of
    the rate (two frames would overflow the kernel's 32-bit transmit time at larger MTUs)."""
    r = host.apply({"interfaces": [{"name": "tpc0", "mtu": 9000, "up": True}],
                    "qos": [{"dev": "tpc0", "rate": "1gbit", "classes": [
                        {"dst": "10.236.9.2", "rate": "1kbit"},
                        {"dst": "10.236.9.3", "rate": "10mbit"}]}]})
    assert r.returncode == 0, r.stderr
    classes = {c["handle"]: c for c in tc_classes(host.ns, "tpc0")}
    for handle, burst, cburst in (("7470:1", 500_000, 500_000), ("7470:2", 3_750, 500_000),
                                  ("7470:3", 2 * 9014, 500_000)):
        assert abs(classes[handle]["burst"] - burst) <= 0.01 * burst, classes[handle]
        assert abs(classes[handle]["cburst"] - cburst) <= 0.01 * cburst, classes[handle]


def test_classes_with_too_little_credit_are_set_again(host: Host):
    """A class with less credit than the agent gives (made by an agent before the credit rule,
    or by hand) is reported by diff and set again at the same rates by apply; then nothing
    is left to do. Read back with tc."""
    assert host.apply(full_state()).returncode == 0
    for cls, rate, ceil in (("7470:1", "200mbit", "200mbit"), ("7470:2", "50mbit", "200mbit")):
        parent = "7470:" if cls == "7470:1" else "7470:1"
        ns_exec(host.ns, "tc", "class", "replace", "dev", "tpa0", "parent", parent, "classid",
                cls, "htb", "rate", rate, "ceil", ceil, "burst", "1600", "cburst", "1600")
    starved = {c["handle"]: c for c in tc_classes(host.ns, "tpa0")}
    assert starved["7470:2"]["burst"] < 2000 and starved["7470:1"]["burst"] < 2000
    r = host.diff(full_state())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "set link rate dev tpa0 200mbit" in r.stdout
    assert "change dev tpa0 class 2" in r.stdout and "class 40" not in r.stdout, r.stdout
    assert host.apply(full_state(), "--detailed-exitcode").returncode == 2
    classes = {c["handle"]: c for c in tc_classes(host.ns, "tpa0")}
    assert abs(classes["7470:2"]["burst"] - 25_000) <= 250, classes["7470:2"]
    assert abs(classes["7470:1"]["burst"] - 100_000) <= 1000, classes["7470:1"]
    assert classes["7470:2"]["rate"] == 50_000_000 and classes["7470:2"]["ceil"] == 200_000_000
    assert host.apply(full_state()).returncode == 0


def test_qos_on_a_link_with_a_foreign_qdisc_is_refused(host: Host):
    sh(["tc", "-n", host.ns, "qdisc", "add", "dev", "tpa0", "root", "handle", "5:", "tbf",
        "rate", "10mbit", "burst", "32kbit", "latency", "50ms"])
    before = dump(host.ns)
    r = host.apply({"qos": [{"dev": "tpa0", "rate": "100mbit"}]})
    assert r.returncode == 1
    assert "qos[0].dev: tpa0 has a root qdisc the agent does not own" in r.stderr
    assert dump(host.ns) == before


def test_rollback_steps_back_through_history(host: Host):
    # the kernel attaches a default qdisc when a link first goes up and keeps it when the link
    # goes down again: start with the links up and down once so "initial" is reachable
    for dev in ("tpa0", "tpc0", "tpd0"):
        sh(["ip", "-n", host.ns, "link", "set", dev, "up"])
        sh(["ip", "-n", host.ns, "link", "set", dev, "down"])
    initial = dump(host.ns)
    assert host.apply(full_state()).returncode == 0
    after_a = dump(host.ns)
    b = full_state()
    b["interfaces"][0]["addresses"] = ["10.231.1.5/24"]  # same subnet: secondary promotion
    b["routes"][1]["nexthops"][0]["weight"] = 1
    b["qos"][0]["classes"][0]["rate"] = "70mbit"
    b["sysctl"]["rp_filter"]["tpa0"] = 1
    assert host.apply(b, "--detailed-exitcode").returncode == 2
    addrs = {i["local"] for a in ip_json(host.ns, "-4", "addr", "show", "dev", "tpa0")
             for i in a["addr_info"]}
    assert addrs == {"10.231.1.5"}
    assert host.agent("rollback", "--detailed-exitcode").returncode == 2
    assert dump(host.ns) == after_a
    assert host.agent("rollback", "--detailed-exitcode").returncode == 2
    assert dump(host.ns) == initial
    r = host.agent("rollback")
    assert r.returncode == 0 and "nothing to roll back" in r.stdout  # nothing to do: success


def test_probe_failure_reverts(host: Host):
    state = {"interfaces": [{"name": "tpa0", "addresses": ["10.231.1.1/24"], "up": True},
                            {"name": "tpc0", "addresses": ["10.231.3.1/24"], "up": True},
                            {"name": "tpd0", "up": True}],
             "routes": [{"dst": "10.236.20.0/24", "via": "10.231.1.2"}]}
    assert host.apply(state).returncode == 0
    before = dump(host.ns)
    # steer traffic to the planned next hop 10.231.1.2 into a veth where nobody answers
    breaking = dict(state, routes=state["routes"] + [
        {"dst": "10.231.1.2/32", "dev": "tpc0", "table": 200}],
        rules=[{"priority": 1000, "to": "10.231.1.2/32", "table": 200}])
    r = host.apply(breaking)
    assert r.returncode == 1 and "probe" in r.stderr and "10.231.1.2" in r.stderr
    assert dump(host.ns) == before
    r = host.apply(breaking, "--no-probe")
    assert r.returncode == 0


def test_missing_namespace_is_an_error():
    r = subprocess.run([sys.executable, "-m", "topoagent.cli", "--netns", "tpt-does-not-exist",
                        "show"], capture_output=True, text=True)
    assert r.returncode == 1 and "no such network namespace" in r.stderr


def test_a_second_apply_on_the_same_target_waits_for_none(host: Host):
    import fcntl

    host.state_dir.mkdir(parents=True)
    before = dump(host.ns)
    with open(host.state_dir / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # what a running apply holds
        r = host.apply(full_state())
    assert r.returncode == 1 and "another topo-agent is applying" in r.stderr
    assert dump(host.ns) == before
    assert host.apply(full_state()).returncode == 0


def test_management_connection_is_protected_unless_forced(host: Host):
    state = full_state()
    assert host.apply(state).returncode == 0
    before = dump(host.ns)
    down = full_state()
    down["interfaces"][0]["up"] = False
    detour = full_state()
    detour["routes"].append({"dst": "10.231.1.2/32", "via": "10.231.3.2"})
    env_mgmt = {"SSH_CONNECTION": "10.231.1.2 50000 10.231.1.1 22"}
    for bad in (down, detour):
        # as sshd would tell it ...
        r = subprocess.run(
            [sys.executable, "-m", "topoagent.cli", "--netns", host.ns, "--state-dir",
             str(host.state_dir), "apply", "-"], input=yaml.safe_dump(bad), text=True,
            capture_output=True, env={**os.environ, **env_mgmt})
        assert r.returncode == 1 and "management connection 10.231.1.2 -> 10.231.1.1" in r.stderr
        # ... or given explicitly
        r = host.agent("--mgmt", "10.231.1.2,10.231.1.1", "apply", "-", stdin=yaml.safe_dump(bad))
        assert r.returncode == 1 and "--force-mgmt" in r.stderr
        assert dump(host.ns) == before
    # forced, the guard lets it through; the probe still sees the next hop go silent
    r = host.agent("--mgmt", "10.231.1.2,10.231.1.1", "--force-mgmt", "apply", "-",
                   stdin=yaml.safe_dump(detour))
    assert r.returncode == 1 and "probe" in r.stderr
    r = host.agent("--mgmt", "10.231.1.2,10.231.1.1", "--force-mgmt", "apply", "--no-probe",
                   "-", stdin=yaml.safe_dump(detour))
    assert r.returncode == 0
