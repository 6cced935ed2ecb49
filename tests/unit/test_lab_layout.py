"""Lab layout and iproute2 batches, computed without touching the machine: names fit the
kernel's limits and carry the lab prefix, every cable is shaped both ways, ports are unique."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from topoctl.lab import commands, names
from topoctl.lab.emulated import as_emulated
from topoctl.lab.layout import Layout, build_layout, find_cable, mgmt_block_size
from topoctl.spec.cluster_load import load_cluster, parse_cluster

PLANS = Path(__file__).resolve().parents[2] / "plans"


def _hetero() -> Layout:
    return build_layout(load_cluster(PLANS / "hetero8-cluster.yaml"), "hetero8",
                        "10.232.3.0/24")


def test_names_and_prefix():
    lay = _hetero()
    pre = names.prefix("hetero8")
    assert all(h.ns.startswith(pre) for h in lay.hosts) and lay.wire_ns.startswith(pre)
    assert all(h.mgmt_root_if.startswith(pre) and len(h.mgmt_root_if) <= 15 for h in lay.hosts)
    assert not pre.startswith("tpt-")  # the test namespaces' prefix
    assert [h.mgmt_ip for h in lay.hosts][:2] == ["10.232.3.2", "10.232.3.3"]
    assert lay.gateway == "10.232.3.1"
    ends = [p.end for h in lay.hosts for p in h.ports]
    assert len(set(ends)) == len(ends) == 26
    macs = [p.mac for h in lay.hosts for p in h.ports]
    assert len(set(macs)) == len(macs) and all(m.startswith("02:") for m in macs)


@pytest.mark.parametrize("bad", ["", "Lab", "1ab", "toolongname", "a-b"])
def test_bad_lab_names(bad):
    with pytest.raises(ValueError, match="lab name"):
        names.check_lab_name(bad)


def test_mgmt_root_if_limit():
    assert names.mgmt_root_if("abcdefghi", 36 * 36 - 1) == "tp-abcdefghi-zz"
    with pytest.raises(ValueError, match="too long"):
        names.mgmt_root_if("abcdefghi", 36 * 36)


def test_mgmt_block_size():
    assert mgmt_block_size(8) == 24 and mgmt_block_size(253) == 24
    assert mgmt_block_size(254) == 23 and mgmt_block_size(1000) == 22


def test_every_cable_shaped_both_ways_and_redirected():
    lay = _hetero()
    tc = commands.wire_tc_batch(lay, netem=False)
    for c in lay.cables:
        for src, dst in ((c.a_end, c.b_end), (c.b_end, c.a_end)):
            # token credit: BURST_S at the cable's rate, at least two jumbo frames
            burst = max(int(c.rate * commands.BURST_S / 8), 2 * 9014)
            assert f"class add dev {src} parent 1: classid 1:1 htb rate {c.rate}bit " \
                   f"ceil {c.rate}bit quantum 9014 burst {burst} cburst {burst}" in tc
            assert any(ln.startswith(f"filter add dev {src} ingress") and
                       ln.endswith(f"redirect dev {dst}") for ln in tc)
    assert not any("netem" in ln for ln in tc)
    # the same credit in seconds at the cable's rate (the tree runtime's cost model): BURST_S
    # on a fast cable, two jumbo frames' worth on a slow one
    assert commands.cable_credit_s(200e6, 9000) == pytest.approx(commands.BURST_S, rel=1e-6)
    assert commands.cable_credit_s(5e6, 9000) == pytest.approx(2 * 9014 * 8 / 5e6)
    with_netem = commands.wire_tc_batch(lay, netem=True)
    assert sum("netem delay 1000us" in ln for ln in with_netem) == 4  # 2 cables x 2 directions


def test_host_batch_leaves_fabric_ports_unconfigured():
    lay = _hetero()
    lines = commands.host_batch(lay, "h4")
    assert [ln for ln in lines if ln.startswith("addr add")] == \
        ["addr add 10.232.3.6/24 dev tpmgmt"]
    assert "link set eth2 addrgenmode none" in lines and "link set eth2 up" in lines
    # an IPv6 cluster's ports get their link-local address (neighbour discovery needs it)
    v6 = commands.host_batch(lay, "h4", ipv6=True)
    assert "link set eth2 addrgenmode eui64" in v6 and "link set tpmgmt addrgenmode none" in v6
    assert [ln for ln in v6 if ln.startswith("addr add")] == \
        ["addr add 10.232.3.6/24 dev tpmgmt"]


def test_root_batch_creates_in_place():
    lay = _hetero()
    root = commands.root_batch(lay)
    assert root[0] == f"netns add {lay.wire_ns}"
    p = lay.host("h0").ports[0]
    assert (f"link add name eth0 netns tp-hetero8-h-h0 address {p.mac} mtu 9000 type veth "
            f"peer name {p.end} netns tp-hetero8-wire mtu 9000") in root


def test_switched_layout():
    lay = build_layout(load_cluster(PLANS / "leafspine8-cluster.yaml"), "ls", "10.232.9.0/24")
    assert lay.bridges == {"leaf0": "s0", "leaf1": "s1", "spine": "s2"}
    assert [(s.ref, s.bridge) for s in lay.switch_ports][:5:4] == [("h0:eth0", "s0"),
                                                                  ("h4:eth0", "s1")]
    assert [(u.leaf_end, u.spine_end, u.rate) for u in lay.uplinks] == \
        [("u0", "v0", 200_000_000), ("u1", "v1", 200_000_000)]
    ip = commands.wire_ip_batch(lay)
    assert "link set b0 master s0 up" in ip and "link set v1 master s2 up" in ip
    assert find_cable(lay, "h5:eth0") == [("h5:eth0--leaf1", ["e5"])]


def test_find_cable_and_round_trip():
    lay = _hetero()
    assert find_cable(lay, "h1:eth1") == [("h0:eth0--h1:eth1", ["e0", "e5"])]
    with pytest.raises(ValueError, match="no port h9:eth0"):
        find_cable(lay, "h9:eth0")
    assert Layout.from_dict(lay.to_dict()) == lay
    c = parse_cluster({"name": "x", "defaults": {"nic_speed": "10mbit"},
                       "hosts": [{"name": "a", "nics": [{"name": "p0"}, {"name": "p1"}]},
                                 {"name": "b", "nics": [{"name": "p0"}]}],
                       "fabric": {"kind": "direct", "links": [{"a": "a:p0", "b": "b:p0"}]}})
    lay2 = build_layout(c, "x", "10.232.0.0/24")
    with pytest.raises(ValueError, match="a:p1 is not cabled"):
        find_cable(lay2, "a:p1")
    assert commands.cabled_ends(lay2) == ["e0", "e2"]


def test_as_emulated_clears_latency_and_loss_and_names_them():
    doc = yaml.safe_load((PLANS / "hetero8-cluster.yaml").read_text())
    doc["defaults"]["loss"] = "0.1%"
    out, cleared = as_emulated(doc)
    assert cleared == ["defaults.loss", "fabric.links[3].latency", "fabric.links[6].latency",
                       "fabric.links[9].latency"]
    graph = parse_cluster(out, "t").graph()
    assert all(ln.latency == 0 for ln in graph.links)
    assert doc["fabric"]["links"][3]["latency"] == "1ms"  # the input is left alone
    # a cluster without latency comes back equal, nothing named
    same, none = as_emulated(out)
    assert same == out and none == []


def test_runtime_is_calibrated_under_the_lab_hosts_congestion_control():
    from topoctl.lab.lab import HOST_TCP_CONGESTION
    from topotrain.collectives.calibrate import TCP_CONGESTION

    assert TCP_CONGESTION == HOST_TCP_CONGESTION
