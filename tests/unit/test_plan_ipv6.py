"""IPv6 in the plan (`addressing.family`): the cluster field and its errors, the addresses the
renderer assigns in either family, and a dual-stack plan that stays byte for byte the recorded
one (tests/unit/golden/dual-mesh4-mlp-bandwidth-plan.yaml, rewritten on purpose with
`.venv/bin/python -m tests.unit.test_plan_ipv6 --write`). The lab and a run over IPv6:
tests/e2e/test_ipv6_lab.py."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

import pytest
import yaml

from topoagent.state.host import parse_host_state
from topoctl.cli import main
from topoctl.render.addressing import assign_cluster
from topoctl.render.ovs import INTERNAL, ovs_host
from topoctl.render.yamlout import scalar
from topoctl.rollout.links import route_devices
from topoctl.rollout.renumber import subnet_map
from topoctl.spec.cluster import ClusterError
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import JobError, parse_job

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "plans"
# a file beside the diff cases (each directory of golden/ is one: test_diff_golden)
GOLDEN = Path(__file__).parent / "golden" / "dual-mesh4-mlp-bandwidth-plan.yaml"
ULA = ipaddress.IPv6Network("fd74:6f70:6f63::/48")


def cluster_doc(name: str, **addressing) -> dict:
    doc = yaml.safe_load((PLANS / f"{name}-cluster.yaml").read_text())
    if addressing:
        doc["addressing"] = doc.get("addressing", {}) | addressing
    return doc


def problems(doc: dict) -> list[tuple[str, str]]:
    with pytest.raises(ClusterError) as e:
        parse_cluster(doc, "c.yaml")
    return e.value.problems


def test_default_family_is_ipv4_and_the_pools_are_the_projects_ula():
    a = parse_cluster(cluster_doc("mesh4")).addressing
    assert a.family == "ipv4"
    assert ipaddress.IPv6Network(a.fabric6).subnet_of(ULA)
    assert ipaddress.IPv6Network(a.training6).subnet_of(ULA)
    assert bytes.fromhex("746f706f63") == b"topoc"  # the ULA's global ID, documented


@pytest.mark.parametrize("addressing, path, words", [
    ({"family": "ipv7"}, "addressing.family", "'ipv4', 'ipv6' or 'dual'"),
    ({"fabric6": "10.1.0.0/16"}, "addressing.fabric6", "not an IPv6 network"),
    ({"fabric6": "fd74:6f70:6f63:8000::/72"}, "addressing.fabric6", "longer than /64"),
    ({"training6": "fe80::/64"}, "addressing.training6", "special-use"),
    ({"training6": "fd74:6f70:6f63:1::/126"}, "addressing.training6", "too small for 4 hosts"),
    ({"training6": "fd74:6f70:6f63:8000::/64"}, "addressing.training6", "overlaps the fabric6"),
    ({"training6": "fd74::1/64"}, "addressing.training6", "host bits set"),
    ({"training6": "fd74:6f70:6f63:2::/64"}, "addressing.training6", "IPv6 management"),
])
def test_bad_ipv6_pools_name_their_yaml_path(addressing, path, words):
    probs = problems(cluster_doc("mesh4", **({"family": "ipv6"} | addressing)))
    assert any(p == path and words in m for p, m in probs), probs


@pytest.mark.parametrize("name", ["mesh4", "switch8"])
def test_ipv6_addresses_per_cable_or_domain_and_per_host(name):
    c = parse_cluster(cluster_doc(name, family="ipv6"))
    a = assign_cluster(c.graph(), c.addressing)
    assert a.version == 6 and a.other is None
    assert len(set(a.training.values())) == len(c.hosts)
    assert all(ipaddress.IPv6Address(t) in ipaddress.IPv6Network(c.addressing.training6)
               for t in a.training.values())
    nets = [ipaddress.IPv6Network(n) for n in a.subnets.values()]
    assert all(n.prefixlen == 64 and n.subnet_of(ipaddress.IPv6Network(c.addressing.fabric6))
               for n in nets)
    assert len(set(nets)) == len(nets)
    for text in a.port.values():  # every port in its cable's (domain's) /64
        iface = ipaddress.IPv6Interface(text)
        assert iface.network in nets and iface.ip != iface.network.network_address


def test_ipv6_only_plan_has_no_ipv4_in_hosts_and_parses_as_agent_state(tmp_path):
    """Switched fabric (star): routes straight to the destination in the shared /64."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster_doc("switch8", family="ipv6")))
    out = tmp_path / "plan.yaml"
    assert main(["plan", str(path), str(PLANS / "mlp-job.yaml"), "-o", str(out),
                 "--no-cache"]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["metadata"]["addressing"]["family"] == "ipv6"
    for st in doc["hosts"].values():
        parse_host_state(st)
        addrs = [a for i in st["interfaces"] for a in i["addresses"]]
        assert addrs and all(":" in a for a in addrs)
        assert all(":" in r["dst"] and ":" in r["via"] for r in st["routes"])
        assert "rp_filter" not in st.get("sysctl", {})
        assert all(i.get("dad") is False for i in st["interfaces"] if i["name"] != "lo")
    master = doc["job"]["master"]["address"]
    assert ipaddress.IPv6Address(master) in ipaddress.IPv6Network("fd74:6f70:6f63:1::/64")
    assert all(p["env"]["MASTER_ADDR"] == master and ":" in p["bind_address"]
               for ps in doc["job"]["processes"].values() for p in ps)


def dual_plan(tmp: Path) -> bytes:
    """mesh4 dual-stack, the MLP job with baseline+bandwidth, multipath: QoS classes,
    policy-routed multipath (an IPv6 rule, IPv6 hash policy) and forwarding hosts."""
    cpath = tmp / "mesh4-dual-cluster.yaml"
    cpath.write_text(yaml.safe_dump(cluster_doc("mesh4", family="dual")))
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text()) | {
        "strategies": ["baseline+bandwidth"], "bandwidth": {"multipath": True}}
    jpath = tmp / "job.yaml"
    jpath.write_text(yaml.safe_dump(job))
    out = tmp / "plan.yaml"
    assert main(["plan", str(cpath), str(jpath), "-o", str(out), "--no-cache"]) == 0
    return out.read_bytes()


def test_dual_stack_plan_is_the_recorded_one(tmp_path, capsys):
    got = dual_plan(tmp_path)
    capsys.readouterr()
    assert got == GOLDEN.read_bytes(), f"the dual-stack plan moved (kept at {tmp_path})"
    doc = yaml.safe_load(got)
    a = doc["metadata"]["addressing"]
    assert a["family"] == "dual" and set(a["ipv4"]) == {"training", "subnets"}
    fams = {4: 0, 6: 0}
    for st in doc["hosts"].values():
        parse_host_state(st)
        lo = st["interfaces"][0]["addresses"]
        assert [ipaddress.ip_interface(x).version for x in lo] == [6, 4]
        for r in st["routes"]:
            fams[ipaddress.ip_network(r["dst"]).version] += 1
        for q in st.get("qos", []):  # training runs over IPv6: its classes match IPv6
            assert all(":" in c["dst"] for c in q["classes"])
        assert [r.get("family") for r in st["rules"]] == ["ipv6"]
        assert st["sysctl"]["ipv6_multipath_hash_policy"] == 1
        # the detours carry IPv6 (training) traffic only: IPv6 forwarding, IPv4's untouched
        assert st["sysctl"]["ipv6_forwarding"] is True and "ip_forward" not in st["sysctl"]
        assert all(":" in h["via"] for r in st["routes"] for h in r.get("nexthops", []))
    assert fams[4] > 0 and fams[6] > fams[4]  # both reachable; policy routes in IPv6
    assert ":" in doc["job"]["master"]["address"]


def test_tc_offload_on_an_ipv6_cluster_is_a_job_error_at_forwarding():
    from topoctl.planner import prepare

    c = parse_cluster(cluster_doc("mesh4", family="ipv6"))
    job = parse_job(yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
                    | {"forwarding": "tc-offload", "strategies": ["topoopt"]})
    with pytest.raises(JobError) as e:
        prepare(c, job, use_cache=False)
    assert e.value.problems[0][0] == "forwarding"
    assert "IPv4 only" in e.value.problems[0][1] and "ipv6" in e.value.problems[0][1]


def test_renumber_and_route_devices_read_both_families():
    new = {"metadata": {"addressing": {"subnets": {"c": "fd74:6f70:6f63:8001::/64"},
                                       "ipv4": {"subnets": {"c": "10.234.0.4/30"}}}}}
    old = {"metadata": {"addressing": {"subnets": {"c": "fd74:6f70:6f63:8000::/64"},
                                       "ipv4": {"subnets": {"c": "10.234.0.0/30"}}}}}
    m = subnet_map(new, old)
    assert m == {ipaddress.ip_network("fd74:6f70:6f63:8001::/64"):
                 ipaddress.ip_network("fd74:6f70:6f63:8000::/64"),
                 ipaddress.ip_network("10.234.0.4/30"): ipaddress.ip_network("10.234.0.0/30")}
    state = {"interfaces": [{"name": "eth0", "addresses": ["fd74:6f70:6f63:8000::1/64",
                                                           "10.234.0.1/30"]},
                            {"name": "eth1", "addresses": ["fd74:6f70:6f63:8001::1/64"]}],
             "routes": [{"dst": "fd74:6f70:6f63:1::2/128", "via": "fd74:6f70:6f63:8001::2"},
                        {"dst": "10.236.0.2/32", "via": "10.234.0.2"}]}
    assert route_devices(state) == {"eth0", "eth1"}


def test_an_ovs_host_moves_dad_false_with_its_ipv6_addresses():
    state = {"interfaces": [{"name": "lo", "addresses": ["fd74:6f70:6f63:1::1/128"]},
                            {"name": "eth0", "addresses": ["fd74:6f70:6f63:8000::1/64"],
                             "mtu": 9000, "up": True, "dad": False}],
             "routes": [{"dst": "fd74:6f70:6f63:1::2/128", "via": "fd74:6f70:6f63:8000::2",
                         "dev": "eth0", "src": "fd74:6f70:6f63:1::1"}]}
    out = ovs_host(state)
    parse_host_state(out)
    by = {i["name"]: i for i in out["interfaces"]}
    assert "dad" not in by["eth0"] and "addresses" not in by["eth0"]
    assert by[INTERNAL]["dad"] is False
    assert by[INTERNAL]["addresses"] == ["fd74:6f70:6f63:8000::1/64"]


@pytest.mark.parametrize("text, plain", [
    ("fd74:6f70:6f63:1::2/128", True), ("fd74:6f70:6f63:8000::/64", True),
    ("fd74:6f70:6f63:8000::", False), ("0c:42:a1:00:00:01", False), ("1:2:3:4:5:6:7:8", False),
])
def test_ipv6_text_is_plain_yaml_only_where_it_reads_back(text, plain):
    out = scalar(text)
    assert (out == text) is plain
    assert yaml.safe_load(f"{{x: {out}}}")["x"] == text


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory(prefix="tp-golden-") as tmp:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_bytes(dual_plan(Path(tmp)))
