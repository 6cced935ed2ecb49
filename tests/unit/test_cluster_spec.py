"""cluster.yaml: the examples in plans/ load, the fabric comes out as plain data with the right
capacities, and bad files fail with errors that name the YAML path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from topoctl.spec.cluster import ClusterError, parse_duration, parse_loss
from topoctl.spec.cluster_load import load_cluster, parse_cluster

PLANS = Path(__file__).resolve().parents[2] / "plans"
MBIT = 10**6


def _direct(**over) -> dict:
    d = {
        "apiVersion": "topoctl/v1", "kind": "Cluster", "name": "t3",
        "defaults": {"nic_speed": "100mbit"},
        "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                  for i in range(3)],
        "fabric": {"kind": "direct", "links": [
            {"a": "h0:eth0", "b": "h1:eth1", "bandwidth": "50mbit", "latency": "1ms"},
            {"a": "h1:eth0", "b": "h2:eth1"},
            {"a": "h2:eth0", "b": "h0:eth1", "loss": "1%"},
        ]},
    }
    d.update(over)
    return d


def _errors(data) -> str:
    with pytest.raises(ClusterError) as e:
        parse_cluster(data)
    return str(e.value)


@pytest.mark.parametrize("name,hosts,links,degrees", [
    ("hetero8", 8, 13, {2, 3, 4}),
    ("topoopt12", 12, 24, {4}),
    ("switch8", 8, 8, {1}),
    ("tworack8", 8, 28, {7}),
    ("leafspine8", 8, 10, {1}),
])
def test_examples_load(name, hosts, links, degrees):
    c = load_cluster(PLANS / f"{name}-cluster.yaml")
    g = c.graph()
    assert c.name == name and len(g.hosts) == hosts and len(g.links) == links
    assert {len(h.nics) for h in c.hosts} == degrees
    assert g.is_connected()


def test_tworack_rates():
    g = load_cluster(PLANS / "tworack8-cluster.yaml").graph()
    rack = {h: int(h[1:]) // 4 for h in g.hosts}
    for ln in g.links:
        assert ln.capacity == (200 * MBIT if rack[ln.a] == rack[ln.b] else 20 * MBIT)


def test_graph_plain_data():
    g = parse_cluster(_direct()).graph()
    a, b, c = g.links
    assert (a.a, a.a_nic, a.b, a.b_nic, a.capacity, a.latency) == \
        ("h0", "eth0", "h1", "eth1", 50 * MBIT, 0.001)
    assert b.capacity == 100 * MBIT and b.latency == 0.0  # default: the slower NIC
    assert c.loss == pytest.approx(0.01)
    assert [n for n, _ in g.neighbours("h0")] == ["h1", "h2"]
    assert yaml.safe_load(yaml.safe_dump(g.to_dict()))["links"][0]["capacity"] == 50 * MBIT


def test_switched_leaf_spine_uplink_capacity():
    g = load_cluster(PLANS / "leafspine8-cluster.yaml").graph()
    up = [ln for ln in g.links if ln.kind == "uplink"]
    assert [(ln.a, ln.b, ln.capacity) for ln in up] == \
        [("leaf0", "spine", 200 * MBIT), ("leaf1", "spine", 200 * MBIT)]  # 4 x 100 / 2
    assert g.switches == ("leaf0", "leaf1", "spine")


def test_round_trip_and_rewire():
    c = parse_cluster(_direct())
    assert parse_cluster(c.to_dict()) == c
    c2 = c.with_fabric({"kind": "direct", "links": [{"a": "h0:eth0", "b": "h2:eth0"}]})
    assert [(ln.a, ln.b) for ln in c2.graph().links] == [("h0", "h2")]
    with pytest.raises(ClusterError, match=r"fabric.links\[0\].b: host h2 has no NIC eth7"):
        c.with_fabric({"kind": "direct", "links": [{"a": "h0:eth0", "b": "h2:eth7"}]})


def test_scalars():
    assert parse_duration("250us") == pytest.approx(250e-6)
    assert parse_duration(0) == 0.0
    assert parse_loss("0.5%") == pytest.approx(0.005)
    for bad in ("fast", "-1ms", True):
        with pytest.raises(ValueError):
            parse_duration(bad)
    with pytest.raises(ValueError):
        parse_loss("100%")


@pytest.mark.parametrize("mutate,expected", [
    (lambda d: d["hosts"][1]["nics"][1].update(speed="fast"),
     "hosts[1].nics[1].speed: not a rate"),
    (lambda d: d["hosts"][2]["nics"][0].update(colour="red"),
     "hosts[2].nics[0].colour: unknown key"),
    (lambda d: d["hosts"][0].update(name="H 0"), "hosts[0].name: "),
    (lambda d: d["hosts"][2].update(name="h0"), "hosts[2].name: h0 is also hosts[0]"),
    (lambda d: d["hosts"][0]["nics"][1].update(name="eth0"),
     "hosts[0].nics[1].name: eth0 is also hosts[0].nics[0]"),
    (lambda d: d["hosts"][0]["nics"][1].update(name="tpmgmt"), "hosts[0].nics[1].name: "),
    (lambda d: d.pop("defaults"), "hosts[0].nics[0].speed: missing"),
    (lambda d: d["fabric"]["links"][1].update(a="h9:eth0"), "fabric.links[1].a: no host h9"),
    (lambda d: d["fabric"]["links"][1].update(b="h2"), "fabric.links[1].b: "),
    (lambda d: d["fabric"]["links"][1].update(b="h0:eth0"),
     "fabric.links[1].b: h0:eth0 is already cabled at fabric.links[0].a"),
    (lambda d: d["fabric"]["links"][1].update(b="h1:eth1"), "fabric.links[1]: both ends"),
    (lambda d: d["fabric"]["links"][0].update(bandwidth="1gbit"),
     "fabric.links[0].bandwidth: 1gbit is above the NIC speed 100mbit"),
    (lambda d: d["fabric"]["links"][0].update(latency="soon"), "fabric.links[0].latency: "),
    (lambda d: d["fabric"].update(kind="mesh"), "fabric: "),
    (lambda d: d.update(bandwidth_matrix={"h0": {"h7": "1mbit"}}),
     "bandwidth_matrix.h0.h7: no host h7"),
    (lambda d: d.update(addressing={"management": "192.168.0.0/24"}),
     "addressing.management: 192.168.0.0/24 is outside 10.232.0.0/16"),
    (lambda d: d.update(apiVersion="topoctl/v9"), "apiVersion: "),
    (lambda d: d.update(hosts=[]), "hosts: "),
])
def test_bad_direct(mutate, expected):
    d = _direct()
    mutate(d)
    assert expected in _errors(d)


@pytest.mark.parametrize("fabric,expected", [
    ({"kind": "switched", "switches": []}, "fabric.switches: "),
    ({"kind": "switched", "switches": [{"name": "a"}, {"name": "b"}]}, "fabric.attach: needed"),
    ({"kind": "switched", "switches": [{"name": "a", "uplink": "z"}]},
     "fabric.switches[0].uplink: no switch z"),
    ({"kind": "switched", "switches": [{"name": "a", "oversubscription": 2}]},
     "fabric.switches[0]: uplink_bandwidth/oversubscription need an uplink"),
    ({"kind": "switched", "switches": [{"name": "a"}],
      "attach": [{"port": "h0", "switch": "a"}, {"port": "h0:eth1", "switch": "b"}]},
     "fabric.attach[1].switch: no switch b"),
    ({"kind": "switched", "switches": [{"name": "a"}],
      "attach": [{"port": "h0", "switch": "a"}, {"port": "h0:eth1", "switch": "a"}]},
     "fabric.attach[1].port: h0:eth1 is already cabled at fabric.attach[0].port"),
])
def test_bad_switched(fabric, expected):
    assert expected in _errors(_direct(fabric=fabric))


def test_many_problems_reported_at_once_and_file_errors(tmp_path):
    d = _direct()
    d["fabric"]["links"][0]["a"] = "h8:eth0"
    d["fabric"]["links"][2]["b"] = "h1:eth9"
    msg = _errors(d)
    assert "fabric.links[0].a: no host h8" in msg and "fabric.links[2].b: host h1 has no NIC" in msg
    p = tmp_path / "c.yaml"
    p.write_text("hosts: [\n")
    with pytest.raises(ClusterError, match="malformed YAML at line"):
        load_cluster(p)
    with pytest.raises(ClusterError, match="No such file"):
        load_cluster(tmp_path / "missing.yaml")
    p.write_text("- 1\n")
    with pytest.raises(ClusterError, match="expected a mapping"):
        load_cluster(p)


def test_ovs_flag_defaults():
    d = _direct(defaults={"nic_speed": "100mbit", "ovs": True})
    d["hosts"][1]["ovs"] = False
    c = parse_cluster(d)
    assert [c.runs_ovs(h) for h in ("h0", "h1", "h2")] == [True, False, True]
    assert not parse_cluster(_direct()).runs_ovs("h0")


@pytest.mark.parametrize(("macs", "path", "says"), [
    (["02:00:00:00:00:01", "02:00:00:00:00:01"], "hosts[1].nics[0].mac",
     "02:00:00:00:00:01 is also hosts[0].nics[0].mac"),
    (["03:00:00:00:00:01", None], "hosts[0].nics[0].mac",
     "03:00:00:00:00:01 is not a unicast address"),
    (["00:00:00:00:00:00", None], "hosts[0].nics[0].mac",
     "00:00:00:00:00:00 is not a unicast address"),
])
def test_nic_macs_are_unique_unicast_addresses(macs, path, says):
    """Found by the audit: `lab up` cabled two NICs with one MAC."""
    d = _direct()
    for h, mac in zip(d["hosts"], macs, strict=False):
        if mac:
            h["nics"][0]["mac"] = mac
    with pytest.raises(ClusterError) as e:
        parse_cluster(d)
    assert (path, says) in e.value.problems, e.value.problems


@pytest.mark.parametrize(("pools", "path", "says"), [
    ({"fabric": "10.236.0.0/16"}, "addressing.training",
     "10.236.0.0/16 overlaps the fabric pool 10.236.0.0/16"),
    ({"fabric": "10.0.0.0/8"}, "addressing.training",
     "10.236.0.0/16 overlaps the fabric pool 10.0.0.0/8"),
    ({"training": "10.232.5.0/24", "management": "10.232.0.0/16"}, "addressing.management",
     "10.232.0.0/16 overlaps the training pool 10.232.5.0/24"),
    ({"training": "127.1.0.0/16"}, "addressing.training",
     "127.1.0.0/16 overlaps 127.0.0.0/8, a special-use range"),
    ({"fabric": "224.0.0.0/4"}, "addressing.fabric",
     "224.0.0.0/4 overlaps 224.0.0.0/3, a special-use range"),
])
def test_address_pools_are_apart_and_ordinary(pools, path, says):
    """Found by the audit: overlapping pools gave one IP to two links (a planner traceback)."""
    with pytest.raises(ClusterError) as e:
        parse_cluster(_direct(addressing=pools))
    assert (path, says) in e.value.problems, e.value.problems


def test_lab_up_refuses_duplicate_macs_before_creating_anything(tmp_path):
    from tests.fuzzgen import topoctl
    from tests.netns import list_netns

    d = _direct(name="tdup")
    for h in d["hosts"][:2]:
        h["nics"][1]["mac"] = "02:aa:00:00:00:01"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(d))
    state = str(tmp_path / "s")
    rc, _, err = topoctl(["lab", "up", str(path), "--state-dir", state])
    if rc == 0:  # it was built: take it down before failing
        topoctl(["lab", "down", "--lab", "tdup", "--state-dir", state])
    assert rc == 1, err
    assert (f"topoctl: {path}: hosts[1].nics[1].mac: 02:aa:00:00:00:01 is also "
            f"hosts[0].nics[1].mac") in err
    assert not [n for n in list_netns() if "tdup" in n] and not (tmp_path / "s").exists()
