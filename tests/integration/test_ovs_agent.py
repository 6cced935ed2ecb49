"""topo-agent's Open vSwitch driver against real ovsdb-server + ovs-vswitchd (userspace
datapath) in throwaway namespaces, through the real CLI; assertions read the host back with
ovs-vsctl, ovs-ofctl, tc and iperf3.

Host namespace H runs OVS; bridge tpbr1 holds H's two veths (tpa0, tpc0) and the internal port
tpin0 with 10.231.9.1/24. The peer namespace P has tpb0 (10.231.9.2/24, 10.231.9.3/24) and tpd0
(10.231.10.2/24), and 10.231.8.2/32 on lo (the multipath destination)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.integration.forkagent import ForkAgent
from tests.netns import ip_json, ns_exec, sh
from topoctl.lab import ovs as labovs

pytestmark = pytest.mark.netns


@dataclass
class OvsHost:
    """A namespace on the userspace datapath; `agent` runs `topo-agent` on it, as a child of
    the module's fork server when `fork` is set (see `tests.integration.test_agent.Host`)."""

    ns: str
    peer: str
    rundir: Path
    state_dir: Path
    fork: ForkAgent | None = None

    @property
    def db(self) -> str:
        return f"unix:{self.rundir}/db.sock"

    def agent(self, *args: str, stdin: str | None = None, db: str | None = None
              ) -> subprocess.CompletedProcess:
        argv = ["--netns", self.ns, "--state-dir", str(self.state_dir), "--ovsdb",
                db or self.db, *args]
        if self.fork is not None:
            return self.fork.run(argv, stdin=stdin, environ=dict(os.environ), timeout=180)
        cmd = [sys.executable, "-m", "topoagent.cli", *argv]
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=180)

    def apply(self, state: dict, *extra: str, db: str | None = None
              ) -> subprocess.CompletedProcess:
        return self.agent("apply", "-", "--no-probe", *extra, stdin=yaml.safe_dump(state),
                          db=db)

    def vsctl(self, *args: str) -> str:
        return sh(["ovs-vsctl", f"--db={self.db}", "--timeout=10", *args]).stdout

    def ofctl(self, *args: str) -> str:
        return sh(["ovs-ofctl", "-O", "OpenFlow15", "--names", *args]).stdout

    def flows(self, br: str = "tpbr1") -> list[str]:
        out = self.ofctl("--no-stats", "dump-flows", f"unix:{self.rundir}/{br}.mgmt")
        return sorted(x.strip() for x in out.splitlines() if "actions=" in x)

    def groups(self, br: str = "tpbr1") -> list[str]:
        out = self.ofctl("dump-groups", f"unix:{self.rundir}/{br}.mgmt")
        return sorted(x.strip() for x in out.splitlines() if x.strip().startswith("group_id"))

    def ovs_dump(self) -> dict:
        """Everything an apply could change, read with the stock tools."""
        def rows(table: str, cols: str) -> list[str]:  # content, not UUIDs (a revert
            # writes equal rows under new UUIDs)
            return sorted(r.strip() for r in
                          self.vsctl(f"--columns={cols}", "list", table).split("\n\n"))

        return {"vsctl": self.vsctl("show"), "qos": rows("qos", "other_config,type"),
                "queues": rows("queue", "other_config"),
                "flows": self.flows() if "tpbr1" in self.vsctl("list-br") else [],
                "groups": self.groups() if "tpbr1" in self.vsctl("list-br") else [],
                "tc": sh(["tc", "-n", self.ns, "filter", "show", "dev", "tpa0", "parent",
                          "1:"], check=False).stdout,
                "addrs": sorted(a["local"] for ln in ip_json(self.ns, "addr")
                                for a in ln.get("addr_info", []))}


@pytest.fixture
def host(make_netns, tmp_path, agent_fork) -> OvsHost:
    ns, peer = make_netns(), make_netns()
    for a, b in (("tpa0", "tpb0"), ("tpc0", "tpd0")):
        sh(["ip", "-n", ns, "link", "add", a, "type", "veth", "peer", "name", b, "netns", peer])
        sh(["ip", "-n", ns, "link", "set", a, "up"])
        sh(["ip", "-n", peer, "link", "set", b, "up"])
        # the userspace datapath receives through AF_PACKET: segments whose checksum the
        # sending veth left to offload arrive broken; the peer end computes them instead
        ns_exec(peer, "ethtool", "-K", b, "tx", "off")
    for a in ("10.231.9.2/24", "10.231.9.3/24"):
        sh(["ip", "-n", peer, "addr", "add", a, "dev", "tpb0"])
    sh(["ip", "-n", peer, "addr", "add", "10.231.10.2/24", "dev", "tpd0"])
    sh(["ip", "-n", peer, "addr", "add", "10.231.8.2/32", "dev", "lo"])
    for k in ("all", "default", "tpb0", "tpd0"):
        ns_exec(peer, "sysctl", "-qw", f"net.ipv4.conf.{k}.rp_filter=0")
        # answer ARP only on the link that holds the address: else tpd0 may answer for
        # 10.231.9.2 and the bridge learns a path around the shaped port tpa0
        ns_exec(peer, "sysctl", "-qw", f"net.ipv4.conf.{k}.arp_ignore=1")
    rundir = tmp_path / "ovs"
    labovs.start(ns, rundir)
    try:
        yield OvsHost(ns, peer, rundir, tmp_path / "state", agent_fork)
    finally:
        for pid in labovs.pids(rundir):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


def _mac(ns: str, dev: str) -> str:
    return ip_json(ns, "link", "show", dev)[0]["address"]


def state(classes=None, flows=None, ports=("tpa0", "tpc0")) -> dict:
    st = {"interfaces": [{"name": "tpin0", "addresses": ["10.231.9.1/24"], "up": True}],
          "routes": [{"dst": "10.231.8.2/32", "via": "10.231.9.2", "dev": "tpin0"}],
          "ovs": {"bridges": [{"name": "tpbr1", "datapath_type": "netdev",
                               "ports": list(ports), "internal": ["tpin0"],
                               "flows": flows or []}]}}
    if classes is not None:
        st["qos"] = [{"dev": "tpa0", "driver": "ovs", "rate": "100mbit",
                      "classes": copy.deepcopy(classes)}]
    return st


CLASSES = [{"dst": "10.231.9.2/32", "rate": "20mbit", "ceil": "20mbit"},
           {"dst": "10.231.9.3/32", "rate": "40mbit", "ceil": "40mbit"}]


def _htb_credit(ns: str, dev: str) -> dict[str, int]:
    """HTB class -> its burst in bytes, as `tc class show` prints it (iproute2 has no JSON for
    HTB's options)."""
    unit = {"": 1, "K": 1024, "M": 1024 * 1024}
    out = sh(["tc", "-n", ns, "class", "show", "dev", dev]).stdout
    return {m[1]: round(float(m[2]) * unit[m[3]])
            for m in re.finditer(r"class htb (\S+) .*? burst ([\d.]+)([KM]?)b", out)}


def test_apply_reapply_show_and_foreign_rows_untouched(host: OvsHost):
    host.vsctl("add-br", "tpfor", "--", "set", "bridge", "tpfor", "datapath_type=netdev")
    host.ofctl("add-flow", f"unix:{host.rundir}/tpfor.mgmt", "priority=5,ip,actions=drop")
    foreign = host.flows("tpfor")
    r = host.apply(state(CLASSES))
    assert r.returncode == 0, r.stderr
    # what the stock tools see: the bridge, integer rates, one queue per destination, flows
    # with set_queue, and the tc stand-in for set_queue on the userspace datapath
    assert sorted(host.vsctl("list-br").split()) == ["tpbr1", "tpfor"]
    assert host.vsctl("get", "bridge", "tpbr1", "datapath_type").strip() == "netdev"
    assert host.vsctl("get", "qos", host.vsctl("get", "port", "tpa0", "qos").strip(),
                      "other_config").strip() == '{max-rate="100000000"}'
    queues = host.vsctl("--columns=other_config", "list", "queue")
    assert 'max-rate="20000000"' in queues and 'min-rate="40000000"' in queues
    flows = host.flows()
    assert "cookie=0x7470, priority=100,ip,nw_dst=10.231.9.2 actions=set_queue:2,NORMAL" in flows
    tc = sh(["tc", "-n", host.ns, "-j", "filter", "show", "dev", "tpa0", "parent", "1:"]).stdout
    assert {f["options"]["flowid"] for f in json.loads(tc) if "flowid" in f.get("options", {})} \
        == {"1:3", "1:4"}
    # each class holds 4 ms of its rate as token credit (OVS's default, one frame, lets a
    # class fall below its rate whenever the kernel's timer fires late)
    credit = _htb_credit(host.ns, "tpa0")
    assert credit["1:3"] >= 20e6 / 8 * 0.004 and credit["1:4"] >= 40e6 / 8 * 0.004, credit
    assert any(a["local"] == "10.231.9.1" for ln in ip_json(host.ns, "addr", "show", "tpin0")
               for a in ln["addr_info"])
    assert ns_exec(host.ns, "ping", "-c1", "-W3", "10.231.9.2", check=False).returncode == 0
    # re-apply: nothing to do
    r = host.apply(state(CLASSES))
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout + r.stderr
    # a foreign flow on our bridge survives a change of ours
    host.ofctl("add-flow", f"unix:{host.rundir}/tpbr1.mgmt",
               "cookie=0x99,priority=7,ip,nw_dst=10.231.77.7,actions=drop")
    r = host.apply(state(CLASSES[:1]))
    assert r.returncode == 0, r.stderr
    flows = host.flows()
    assert any("cookie=0x99" in f for f in flows)
    assert not any("10.231.9.3" in f for f in flows)
    assert host.flows("tpfor") == foreign
    show = host.agent("show", "--ovs")
    rep = yaml.safe_load(show.stdout)
    (port,) = [p for p in rep["bridges"][0]["ports"] if p["name"] == "tpa0"]
    assert port["classification"].startswith("tc u32")
    assert rep["foreign_bridges"] == ["tpfor"]
    # removing the section removes our bridge, QoS and queues; the foreign bridge stays
    r = host.apply({}, "--allow-empty")
    assert r.returncode == 0, r.stderr
    assert host.vsctl("list-br").split() == ["tpfor"]
    assert host.vsctl("list", "qos").strip() == "" and host.vsctl("list", "queue").strip() == ""
    assert host.flows("tpfor") == foreign


def test_internal_port_sysctl_and_protected_nics(host: OvsHost):
    """An rp_filter on the internal port this apply creates is written once the port exists
    (the verify used to fail on it: `rp_filter = 2 (was 0)`), and the bridge's NICs are
    protected ports, so NORMAL never switches a frame from one NIC to another (on a direct
    fabric the hosts' bridges would form one looping L2 domain); a re-apply is a no-op."""
    st = state(CLASSES)
    st["sysctl"] = {"rp_filter": {"tpin0": 2}}
    r = host.apply(st)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ns_exec(host.ns, "cat", "/proc/sys/net/ipv4/conf/tpin0/rp_filter").stdout.strip() \
        == "2"
    protected = {p: host.vsctl("get", "port", p, "protected").strip()
                 for p in ("tpa0", "tpc0", "tpin0")}
    assert protected == {"tpa0": "true", "tpc0": "true", "tpin0": "false"}
    r = host.apply(st)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout + r.stderr
    # a port someone unprotected is protected again by the next apply
    host.vsctl("set", "port", "tpc0", "protected=false")
    r = host.apply(st)
    assert r.returncode == 0, r.stdout + r.stderr
    assert host.vsctl("get", "port", "tpc0", "protected").strip() == "true"


def test_failure_in_the_middle_reverts_ovs_too(host: OvsHost):
    assert host.apply(state(CLASSES)).returncode == 0
    before = host.ovs_dump()
    bad = state(CLASSES[:1] + [{"dst": "10.231.9.4/32", "rate": "10mbit"}],
                flows=[{"dst": "10.231.8.2/32", "output": "tpc0"}])
    # the kernel refuses a preferred source the host does not own (after the OVS writes)
    bad["routes"].append({"dst": "10.231.7.0/24", "via": "10.231.9.2", "src": "10.231.99.99"})
    r = host.apply(bad)
    assert r.returncode == 1 and "reverted" in r.stderr, r.stdout + r.stderr
    assert host.ovs_dump() == before


def test_bad_input_is_refused_with_the_yaml_path(host: OvsHost):
    before = host.ovs_dump()
    r = host.apply(state(CLASSES), db=f"unix:{host.rundir}/nothing.sock")
    assert r.returncode == 1 and "ovs: no ovsdb-server answers" in r.stderr, r.stderr
    bad = state(CLASSES)
    bad["qos"][0]["dev"] = "tpx9"  # queues on a port OVS does not have
    r = host.apply(bad)
    assert r.returncode == 1 and "qos[0].dev: driver ovs, but tpx9 is not a port" in r.stderr
    bad = state(CLASSES)
    bad["qos"][0]["classes"][1]["rate"] = "90mbit"  # 20 + 90 above the NIC's 100 Mbit/s
    r = host.apply(bad)
    assert r.returncode == 1 and "qos[0]: " in r.stderr and "above the link rate" in r.stderr
    bad = state(CLASSES)
    bad["qos"][0]["driver"] = "tc"  # tc and ovs on one port
    r = host.apply(bad)
    assert r.returncode == 1 and "qos[0].driver: tc on tpa0" in r.stderr
    assert host.ovs_dump() == before


def _iperf(ns: str, dst: str, port: int, seconds: int, parallel: int = 1) -> subprocess.Popen:
    # -O 1: the first second (slow start, the HTB bucket's initial credit) is left out of the
    # result, so the rate read is the steady state the classes enforce
    return subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-c", dst, "-p", str(port),
                             "-t", str(seconds), "-O", "1", "-P", str(parallel), "-J"],
                            stdout=subprocess.PIPE, text=True)


@contextlib.contextmanager
def _servers(ns: str, binds: list[tuple[str, int]]):
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-s", "-B", a, "-p",
                               str(p)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for a, p in binds]
    time.sleep(0.5)
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def _received(p: subprocess.Popen) -> float:
    out, _ = p.communicate(timeout=120)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"]


@pytest.mark.serial  # iperf3 rates
def test_per_destination_rates_measured_with_iperf3(host: OvsHost):
    assert host.apply(state(CLASSES)).returncode == 0
    plan = {"10.231.9.2": 20e6, "10.231.9.3": 40e6}
    got: dict = {}
    with _servers(host.peer, [("10.231.9.2", 5301), ("10.231.9.3", 5302)]):
        for _attempt in range(3):  # a loaded machine can starve one run: retry, keep the best
            ps = {d: _iperf(host.ns, d, 5301 + i, 5) for i, d in enumerate(plan)}
            for d, p in ps.items():
                got[d] = max(got.get(d, 0.0), _received(p))
            if all(0.9 * plan[d] <= got[d] <= 1.05 * plan[d] for d in plan):
                break
    # goodput of a shaped 1500-byte MTU link is ~95.6 % of the line rate (tc framing)
    for d, rate in plan.items():
        assert 0.9 * rate <= got[d] <= 1.05 * rate, (d, got)


def test_multipath_weights_show_in_the_split(host: OvsHost):
    flows = [{"dst": "10.231.8.2/32", "nexthops": [
        {"port": "tpa0", "weight": 3, "mac": _mac(host.peer, "tpb0")},
        {"port": "tpc0", "weight": 1, "mac": _mac(host.peer, "tpd0")}]}]
    r = host.apply(state(flows=flows))
    assert r.returncode == 0, r.stderr
    (g,) = host.groups()
    assert "type=select" in g and "weight:3" in g
    assert host.apply(state(flows=flows)).returncode == 0

    def rx() -> dict[str, int]:
        return {ln["ifname"]: ln["stats64"]["rx"]["bytes"]
                for ln in ip_json(host.peer, "-s", "link") if ln["ifname"] in ("tpb0", "tpd0")}

    share = 0.0
    with _servers(host.peer, [("10.231.8.2", 5303)]):
        for _attempt in range(3):
            r0 = rx()
            _received(_iperf(host.ns, "10.231.8.2", 5303, 3, parallel=16))
            r1 = rx()
            b, d = r1["tpb0"] - r0["tpb0"], r1["tpd0"] - r0["tpd0"]
            share = b / (b + d)
            if 0.6 <= share <= 0.9:
                break
    # 16 TCP connections hashed over weights 3:1: about 3/4 of the bytes on tpa0's link
    assert 0.6 <= share <= 0.9, share


def test_show_round_trips_the_ovs_section(host: OvsHost):
    """`topo-agent show` prints the agent's bridges, flows, select groups and OVS queues as a
    HostState (`ovs` section, `qos` with `driver: ovs`): applied again it changes nothing."""
    flows = [{"dst": "10.231.9.3/32", "output": "tpa0"},  # set_queue + output on the port
             {"dst": "10.231.8.2/32", "nexthops": [  # a select group (id from position 1)
                 {"port": "tpa0", "weight": 3, "mac": _mac(host.peer, "tpb0")},
                 {"port": "tpc0", "weight": 1}]}]
    r = host.apply(state(CLASSES, flows=flows))
    assert r.returncode == 0, r.stderr
    before = host.ovs_dump()
    shown = host.agent("show")
    assert shown.returncode == 0, shown.stderr
    doc = yaml.safe_load(shown.stdout)
    (br,) = doc["ovs"]["bridges"]
    assert (br["name"], br["datapath_type"], br["ports"], br["internal"]) == (
        "tpbr1", "netdev", ["tpa0", "tpc0"], ["tpin0"])
    assert [f["dst"] for f in br["flows"]] == ["10.231.9.3/32", "10.231.8.2/32"]
    assert [h.get("weight", 1) for h in br["flows"][1]["nexthops"]] == [3, 1]
    (q,) = [q for q in doc["qos"] if q["dev"] == "tpa0"]
    assert q["driver"] == "ovs"
    assert {c["dst"]: c["id"] for c in q["classes"]} == {"10.231.9.2/32": 2,
                                                         "10.231.9.3/32": 3}
    r = host.agent("diff", "-", stdin=shown.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    r = host.agent("apply", "-", "--no-probe", stdin=shown.stdout)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout + r.stderr
    assert host.ovs_dump() == before
    # what show printed is the host: a queue changed behind the agent's back shows, and the
    # shown state (the old one) puts it back
    qos = host.vsctl("get", "port", "tpa0", "qos").strip()
    qu = host.vsctl("get", "qos", qos, "queues:2").strip()
    host.vsctl("set", "queue", qu, "other_config:min-rate=5000000")
    drift = yaml.safe_load(host.agent("show").stdout)
    (q,) = [q for q in drift["qos"] if q["dev"] == "tpa0"]
    assert {c["dst"]: c["rate"] for c in q["classes"]}["10.231.9.2/32"] in ("5mbit", 5000000)
    r = host.agent("apply", "-", "--no-probe", stdin=shown.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert host.ovs_dump()["queues"] == before["queues"]


def test_killed_apply_recovers_ovs_from_the_journal(host: OvsHost):
    """The journal header holds the host as `show` sees it, OVS sections included: an apply
    killed after its OVSDB write is undone by `recover` to exactly the OVS state before."""
    assert host.apply(state(CLASSES)).returncode == 0
    before = host.ovs_dump()
    new = state(CLASSES[:1] + [{"dst": "10.231.9.4/32", "rate": "10mbit"}],
                flows=[{"dst": "10.231.8.2/32", "output": "tpc0"}])
    env = os.environ | {"TOPO_AGENT_CRASH_AFTER": "1", "TOPO_AGENT_CRASH_MODE": "kill"}
    cmd = [sys.executable, "-m", "topoagent.cli", "--netns", host.ns, "--state-dir",
           str(host.state_dir), "--ovsdb", host.db, "apply", "-", "--no-probe"]
    r = subprocess.run(cmd, input=yaml.safe_dump(new), capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    assert host.ovs_dump() != before  # the OVSDB write happened
    r = host.agent("recover")
    assert r.returncode == 0, r.stdout + r.stderr
    assert host.ovs_dump() == before
    assert host.apply(state(CLASSES)).returncode == 0  # and the agent agrees: nothing to do
