"""A bare-metal cluster's inventory (the operator's cluster file) picks the SSH transport; the
copy a plan carries is only checked against it, never used on its own (trust model)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest
import yaml

from topoagent.state.host import StateError
from topoctl.cli.apply import add_transport_args, pick_transport
from topoctl.planner import make_plan
from topoctl.rollout.transports.ssh import SshTransport
from topoctl.spec.cluster import ClusterError
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

CLUSTER = {
    "apiVersion": "topoctl/v1", "kind": "Cluster", "name": "rack1",
    "defaults": {"nic_speed": "100gbit", "gpus": {"count": 1, "type": "A100"}},
    "inventory": {"user": "ops", "key": "/etc/topoctl/id_ed25519",
                  "known_hosts": "/etc/topoctl/known_hosts",
                  "agent": ["/usr/local/bin/topo-agent"]},
    "hosts": [{"name": f"n{i}", "address": f"192.0.2.{10 + i}", "nics": [{"name": "ens1"}]}
              for i in range(3)],
    "fabric": {"kind": "switched", "switches": [{"name": "tor"}],
               "attach": [{"port": f"n{i}:ens1", "switch": "tor"} for i in range(3)]},
}
JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "j",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 64, "features": 32,
                                              "classes": 4}},
       "batch": {"global": 6}, "cost": {"method": "roofline"}}


def args_for(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_transport_args(p)
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args(["plan.yaml", *argv])


@pytest.fixture
def cluster_file(tmp_path) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    return str(path)


def with_file(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_the_cluster_file_s_inventory_picks_the_transport(cluster_file):
    plan, _, _ = make_plan(parse_cluster(CLUSTER), parse_job(JOB), use_cache=False)
    inv = plan["metadata"]["inventory"]
    assert inv["user"] == "ops" and inv["addresses"]["n2"] == "192.0.2.12"
    t = pick_transport(args_for("--cluster", cluster_file), plan)
    assert isinstance(t, SshTransport)
    assert t.addresses == {"n0": "192.0.2.10", "n1": "192.0.2.11", "n2": "192.0.2.12"}
    assert t.user == "ops" and t.cmd == ["/usr/local/bin/topo-agent"]
    assert str(t.known_hosts) == "/etc/topoctl/known_hosts"


def test_a_host_without_an_address_is_an_error_naming_it(tmp_path):
    plan, _, _ = make_plan(parse_cluster(CLUSTER), parse_job(JOB), use_cache=False)
    del plan["metadata"]["inventory"]
    cl = {**CLUSTER, "hosts": [dict(h) for h in CLUSTER["hosts"]]}
    del cl["hosts"][1]["address"]
    with pytest.raises(StateError) as e:
        pick_transport(args_for("--cluster", with_file(tmp_path, cl)), plan)
    assert e.value.problems == [(f"{tmp_path / 'other.yaml'}.addresses", "no address for n1")]


@pytest.mark.parametrize("keep", [True, False])
def test_no_lab_no_cluster_file_says_what_to_do(keep):
    """The plan's own inventory is never enough: the operator names the cluster (or lab)."""
    plan, _, _ = make_plan(parse_cluster(CLUSTER), parse_job(JOB), use_cache=False)
    if not keep:
        del plan["metadata"]["inventory"]
    plan["metadata"]["cluster"] = "nosuchlab1"
    with pytest.raises(StateError) as e:
        pick_transport(args_for(), plan)
    assert "--lab NAME, --cluster FILE" in str(e.value)
    assert "metadata.inventory is never used on its own" in str(e.value)


@pytest.mark.parametrize(("key", "value"), [
    ("agent", ["sh", "-c", "touch /tmp/pwned"]), ("known_hosts", "/tmp/attacker_known_hosts"),
    ("key", "/tmp/k"), ("user", "root"), ("port", 2222),
    ("addresses", {"n0": "198.51.100.1", "n1": "192.0.2.11", "n2": "192.0.2.12"}),
    ("ovsdb", {"n1": "tcp:198.51.100.9:6640"}), ("shell", "x")])
def test_a_plan_whose_inventory_differs_from_the_cluster_file_is_refused(cluster_file, key,
                                                                          value):
    """Every way a plan could choose how its hosts are reached is named and refused."""
    plan, _, _ = make_plan(parse_cluster(CLUSTER), parse_job(JOB), use_cache=False)
    plan["metadata"]["inventory"][key] = value
    args = args_for("--cluster", cluster_file)
    with pytest.raises(StateError) as e:
        pick_transport(args, plan)
    assert e.value.source == "plan.yaml"
    assert [p for p, _ in e.value.problems] == [f"metadata.inventory.{key}"]


def test_inventory_rejects_unknown_keys():
    bad = {**CLUSTER, "inventory": {"transport": "telnet"}}
    with pytest.raises(ClusterError) as e:
        parse_cluster(bad)
    assert e.value.problems[0][0] == "inventory.transport"


OVS_CLUSTER = {**CLUSTER, "inventory": {**CLUSTER["inventory"],
                                        "ovsdb": "unix:/var/run/openvswitch/db.sock"},
               "hosts": [{**h, "ovs": i > 0} for i, h in enumerate(CLUSTER["hosts"])]}


def test_ovs_hosts_get_their_ovsdb_through_the_ssh_command_line(tmp_path):
    """`qos.driver: ovs` over SSH: the inventory's (or a host's own) ovsdb remote travels in
    the plan and becomes the agent's `--ovsdb` on that host only, before the verb."""
    cl = {**OVS_CLUSTER, "hosts": [dict(h) for h in OVS_CLUSTER["hosts"]]}
    cl["hosts"][2]["ovsdb"] = "tcp:127.0.0.1:6640"
    plan, _, _ = make_plan(parse_cluster(cl), parse_job(JOB), use_cache=False)
    assert plan["metadata"]["inventory"]["ovsdb"] == {
        "n1": "unix:/var/run/openvswitch/db.sock", "n2": "tcp:127.0.0.1:6640"}
    t = pick_transport(args_for("--cluster", with_file(tmp_path, cl)), plan)
    assert isinstance(t, SshTransport)
    assert shlex.join(t.argv("n0", ["apply", "-"])) == (
        "/usr/local/bin/topo-agent --json --detailed-exitcode apply -")
    assert shlex.join(t.argv("n1", ["apply", "-"])) == (
        "/usr/local/bin/topo-agent --json --detailed-exitcode "
        "--ovsdb unix:/var/run/openvswitch/db.sock apply -")
    assert shlex.join(t.argv("n2", ["diff", "-"])).endswith(
        "--ovsdb tcp:127.0.0.1:6640 diff -")
    # the same from the cluster file (`--cluster FILE`)
    from topoctl.cli.apply import inventory_transport

    t2 = inventory_transport(parse_cluster(cl).inventory_doc(), ["n0", "n1", "n2"], "c.yaml")
    assert t2.ovsdb == t.ovsdb


def test_bad_ovsdb_settings_name_the_yaml_path(tmp_path):
    bad = {**OVS_CLUSTER, "inventory": {**OVS_CLUSTER["inventory"], "ovsdb": "/run/db.sock"}}
    with pytest.raises(ClusterError) as e:
        parse_cluster(bad)
    assert e.value.problems[0][0] == "inventory.ovsdb" and "unix:/PATH" in e.value.problems[0][1]
    bad = {**CLUSTER, "hosts": [dict(h) for h in CLUSTER["hosts"]]}
    bad["hosts"][0]["ovsdb"] = "unix:/run/db.sock"  # n0 does not run OVS
    with pytest.raises(ClusterError) as e:
        parse_cluster(bad)
    assert e.value.problems == [("hosts[0].ovsdb", "n0 does not run Open vSwitch (set ovs: "
                                                   "true, or drop ovsdb)")]
    plan, _, _ = make_plan(parse_cluster(OVS_CLUSTER), parse_job(JOB), use_cache=False)
    plan["metadata"]["inventory"]["ovsdb"]["n1"] = "db.sock; rm -rf /"
    with pytest.raises(StateError) as e:
        pick_transport(args_for("--cluster", with_file(tmp_path, OVS_CLUSTER)), plan)
    assert e.value.problems[0][0] == "metadata.inventory.ovsdb"  # differs from the file's
    assert "refusing" in e.value.problems[0][1]


def test_ansible_inventory_gives_ovs_hosts_their_ovsdb():
    """The Ansible path passes the same --ovsdb as SSH: `topo_agent_ovsdb` per OVS host (the
    playbooks put it on the agent's command line), none for a host without OVS."""
    from topoctl.cli.inventory import cluster_inventory

    cl = {**OVS_CLUSTER, "hosts": [dict(h) for h in OVS_CLUSTER["hosts"]]}
    cl["hosts"][2]["ovsdb"] = "tcp:127.0.0.1:6640"
    hosts = cluster_inventory(parse_cluster(cl))["all"]["hosts"]
    assert "topo_agent_ovsdb" not in hosts["n0"] and "topo_agent_require_ovs" not in hosts["n0"]
    assert hosts["n1"]["topo_agent_ovsdb"] == "unix:/var/run/openvswitch/db.sock"
    assert hosts["n2"]["topo_agent_ovsdb"] == "tcp:127.0.0.1:6640"
