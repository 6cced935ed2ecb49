"""The pure parts of `topoctl run --heal` and of naming a failed cable: which interfaces carry
a plan's training, which cable an interface belongs to, the cluster minus a cable, the
connectivity check, and the re-plan around the cable (strategy kept, plan valid, the cable's
ports unused)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from topoctl.planner import make_plan
from topoctl.render.validate import validate_plan
from topoctl.rollout.links import Cable, cable_at, route_devices, watched_interfaces
from topoctl.rollout.renumber import keep_addresses
from topoctl.rollout.replan import HealError, check_healable, components, replan, without_cables
from topoctl.rollout.run import cable_failure
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import load_job, parse_job

PLANS = Path(__file__).resolve().parents[2] / "plans"
CUT = Cable("h3:eth0", "h4:eth1")


def ring(n: int) -> dict:
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"ring{n}",
            "defaults": {"nic_speed": "200mbit", "gpus": {"count": 1, "type": "cpu"}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                      for i in range(n)],
            "fabric": {"kind": "direct", "mtu": 9000, "links": [
                {"a": f"h{i}:eth0", "b": f"h{(i + 1) % n}:eth1"} for i in range(n)]}}


def test_cable_at_names_direct_switched_and_star_cables():
    direct = {"kind": "direct", "links": [{"a": "h0:eth0", "b": "h1:eth1"}]}
    assert cable_at(direct, "h1", "eth1") == Cable("h0:eth0", "h1:eth1")
    assert cable_at(direct, "h1", "eth1").peer("h1:eth1") == "h0:eth0"
    assert cable_at(direct, "h1", "eth0") is None
    star = {"kind": "switched", "switches": [{"name": "sw0"}]}
    assert cable_at(star, "h5", "eth0").name == "h5:eth0--sw0"
    two = {"kind": "switched", "switches": [{"name": "a"}, {"name": "b"}],
           "attach": [{"port": "h0", "switch": "a"}, {"port": "h1:eth1", "switch": "b"}]}
    assert cable_at(two, "h0", "eth3") == Cable("h0:eth3", "a")
    assert cable_at(two, "h1", "eth1") == Cable("h1:eth1", "b")
    assert cable_at(two, "h1", "eth0") is None


def test_route_devices_resolve_gateways_and_multipath():
    state = {"interfaces": [{"name": "lo", "addresses": ["10.236.0.1/32"]},
                            {"name": "eth0", "addresses": ["10.234.0.1/30"]},
                            {"name": "eth1", "addresses": ["10.234.0.5/30"]},
                            {"name": "eth2", "addresses": ["10.234.0.9/30"]}],
             "routes": [{"dst": "10.236.0.2/32", "via": "10.234.0.2"},
                        {"dst": "10.236.0.3/32", "nexthops": [{"via": "10.234.0.6"},
                                                              {"dev": "eth2"}]}]}
    assert route_devices(state) == {"eth0", "eth1", "eth2"}


def test_watched_interfaces_are_the_cabled_ones_routes_use():
    plan = yaml.safe_load((PLANS / "mlp-hetero8-plan.yaml").read_text())
    watched = watched_interfaces(plan)
    assert watched["h6"] == ["eth0", "eth1"] and watched["h0"] == ["eth0", "eth1", "eth2", "eth3"]
    # a host whose routes never leave through eth3 does not watch it
    plan["hosts"]["h0"]["routes"] = [r for r in plan["hosts"]["h0"]["routes"]
                                     if r.get("dev") != "eth3"]
    assert "eth3" not in watched_interfaces(plan)["h0"]
    # behind Open vSwitch the routes name the internal port: every cabled NIC counts
    plan["hosts"]["h0"]["routes"] = [{"dst": "10.236.0.2/32", "dev": "tpovs0"}]
    assert watched_interfaces(plan)["h0"] == ["eth0", "eth1", "eth2", "eth3"]


def test_without_cables_removes_the_cable_in_either_order():
    cluster = load_cluster(PLANS / "hetero8-cluster.yaml")
    left = without_cables(cluster, [Cable("h4:eth1", "h3:eth0")])
    pairs = {(ln.a, ln.b) for ln in left.fabric.links}
    assert len(pairs) == len(cluster.fabric.links) - 1 and ("h3:eth0", "h4:eth1") not in pairs
    assert components(left, [h.name for h in left.hosts]) == [[f"h{i}" for i in range(8)]]
    assert len(cluster.fabric.links) == 13  # the original is unchanged


def test_without_cables_on_a_switch_detaches_the_nic():
    cluster = load_cluster(PLANS / "switch8-cluster.yaml")
    left = without_cables(cluster, [Cable("h2:eth0", "sw0")])
    assert [p for p, _ in left.attachments()] == [f"h{i}:eth0" for i in range(8) if i != 2]
    assert components(left, [h.name for h in left.hosts]) == [
        ["h0", "h1", "h3", "h4", "h5", "h6", "h7"], ["h2"]]


def test_a_cluster_left_disconnected_is_a_clear_error():
    cluster = parse_cluster(ring(4))
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "j",
                     "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 64}},
                     "batch": {"global": 8}, "strategies": ["trees"],
                     "cost": {"method": "roofline"}})
    plan = {"metadata": {"cluster": "ring4", "job": "j", "strategy": "trees"}}
    cut = [Cable("h0:eth0", "h1:eth1"), Cable("h2:eth0", "h3:eth1")]
    with pytest.raises(HealError) as e:
        replan(plan, cluster, job, cut)
    assert str(e.value) == ("without h0:eth0--h1:eth1, h2:eth0--h3:eth1 the cluster is "
                            "disconnected: {h0, h3} | {h1, h2}")


def test_check_healable_names_what_does_not_belong_to_the_plan():
    cluster = load_cluster(PLANS / "hetero8-cluster.yaml")
    job = load_job(PLANS / "mlp-job.yaml")
    plan = yaml.safe_load((PLANS / "mlp-hetero8-plan.yaml").read_text())
    check_healable(plan, cluster, job)  # the plan's own: fine
    plan["metadata"] |= {"job": "other", "cluster": "x", "strategy": "placement"}
    with pytest.raises(HealError) as e:
        check_healable(plan, cluster, job)
    assert [p for p, _ in e.value.problems] == ["--cluster", "--job", "metadata.strategy"]
    assert "data-parallel" in str(e.value)


def addresses(plan: dict) -> dict[str, list[str]]:
    return {f"{h}:{i['name']}": i.get("addresses", []) for h, s in plan["hosts"].items()
            for i in s["interfaces"]}


def test_replan_repacks_the_trees_around_the_cable_keeping_every_other_address():
    cluster = load_cluster(PLANS / "hetero8-cluster.yaml")
    job = load_job(PLANS / "mlp-job.yaml").model_copy(update={"strategies": ["baseline",
                                                                             "trees"]})
    plan, _, _ = make_plan(cluster, job.model_copy(update={"strategies": ["trees"]}))
    new = replan(plan, cluster, job, [CUT])
    assert validate_plan(new) == []
    # the planner alone would renumber every cable after the cut one; the heal keeps them
    before, after = addresses(plan), addresses(new)
    assert {p: a for p, a in after.items() if a} == {
        p: a for p, a in before.items() if a and p not in ("h3:eth0", "h4:eth1")}
    gone = plan["metadata"]["addressing"]["subnets"].pop("h3:eth0-h4:eth1")
    assert new["metadata"]["addressing"]["subnets"] == plan["metadata"]["addressing"]["subnets"]
    assert gone not in str(new["hosts"])
    assert new["metadata"]["strategy"] == "trees"  # the running plan's strategy, kept
    assert not any({ln["a"], ln["b"]} == {"h3:eth0", "h4:eth1"} for ln in new["fabric"]["links"])
    for host, nic in (("h3", "eth0"), ("h4", "eth1")):
        state = new["hosts"][host]
        assert nic not in route_devices(state)
        assert not any(i["name"] == nic and i.get("addresses") for i in state["interfaces"])
        assert nic not in watched_interfaces(new)[host]
    assert new["job"]["collective"]["algorithm"] == "trees"
    assert new["metadata"]["prediction"]["iteration_time"] > 0


def test_keep_addresses_leaves_unrelated_plans_alone():
    a = {"metadata": {"addressing": {"subnets": {"x": "10.234.0.0/30"}}}, "hosts": {}}
    b = {"metadata": {"addressing": {"subnets": {"y": "10.234.0.4/30"}}}, "hosts": {}}
    assert keep_addresses(a, b) is a


def test_the_failure_names_the_cable_and_its_peer():
    downs = [{"host": "h3", "interface": "eth0", "reason": "no carrier", "cable": CUT.name,
              "peer": "h4:eth1"},
             {"host": "h4", "interface": "eth1", "reason": "no carrier", "cable": CUT.name,
              "peer": "h3:eth0"}]
    text = cable_failure(downs, ["rank 2 on h2 exited -15"])
    assert text.splitlines() == [
        "cable h3:eth0--h4:eth1 failed: h3:eth0 no carrier, peer h4:eth1 (reported there "
        "too); training stopped on every host",
        "then 1 rank/host failure(s) followed (ranks stopped)"]


@pytest.mark.parametrize("netem", [False, True])
def test_heal_replans_the_cables_as_the_lab_emulates_them(tmp_path, monkeypatch, netem):
    """On a lab whose kernel has no sch_netem the re-plan's cluster has no latency (the lab's
    cables have none, and the new plan's prediction is compared with them); with sch_netem
    the lab's cluster as written."""
    import argparse

    from topoctl.cli.run_heal import heal_inputs
    from topoctl.lab.lab import Lab
    from topoctl.lab.layout import build_layout

    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(tmp_path))
    cluster = load_cluster(PLANS / "hetero8-cluster.yaml")
    assert any(ln.latency > 0 for ln in cluster.graph().links)
    d = tmp_path / "hx"
    d.mkdir()
    Lab(cluster, build_layout(cluster, "hx", "10.232.250.0/24"), d, netem).save()
    args = argparse.Namespace(job=str(PLANS / "mlp-job.yaml"), cluster=None, lab="hx")
    got, _job = heal_inputs(args, {"metadata": {"cluster": "hx"}})
    lat = [ln.latency for ln in got.graph().links]
    assert (max(lat) > 0) is netem
