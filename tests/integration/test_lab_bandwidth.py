"""A bandwidth plan through Open vSwitch in the lab: `lab up` starts OVS on the hosts marked
`ovs: true`, the plan moves their NICs onto a bridge, `apply` reaches their ovsdb-server through
the lab transport, and per-destination rates measured with iperf3 match the plan."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

import pytest
import yaml

from tests import netns as nsutil
from topoctl.cli.inventory import inventory_text, lab_inventory
from topoctl.lab import lab as labmod
from topoctl.lab import ovs as labovs
from topoctl.planner import make_plan
from topoctl.rollout.ansible import run_playbook
from topoctl.rollout.transports.local import lab_transport
from topoctl.rollout.transports.ssh import lab_ssh_transport
from topoctl.rollout.twophase import apply_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

pytestmark = pytest.mark.netns

CLUSTER = {"name": "tpwbw", "defaults": {"nic_speed": "100mbit"},
           "hosts": [{"name": "h0", "ovs": True, "nics": [{"name": "eth0"}]},
                     {"name": "h1", "nics": [{"name": "eth0"}]},
                     {"name": "h2", "nics": [{"name": "eth0"}]}],
           "fabric": {"kind": "switched", "mtu": 9000, "switches": [{"name": "sw0"}]}}
JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "bw",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 256}},
       "batch": {"global": 48}, "cost": {"method": "roofline"}, "strategies": ["baseline"]}
RATES = {"h1": 30_000_000, "h2": 60_000_000}


def _received(p: subprocess.Popen) -> float:
    out, _ = p.communicate(timeout=120)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"]


@pytest.mark.serial  # iperf3 rates
def test_per_destination_rates_through_ovs_in_the_lab(tmp_path):
    cluster = parse_cluster(CLUSTER)
    doc, _ctx, _ = make_plan(cluster, parse_job(JOB), use_cache=False)
    train = {h: st["interfaces"][0]["addresses"][0].split("/")[0]
             for h, st in doc["hosts"].items()}
    h0 = doc["hosts"]["h0"]
    assert h0["ovs"]["bridges"][0]["ports"] == ["eth0"]  # rendered onto OVS (ovs: true)
    # the per-destination allocation under test: 30 and 60 Mbit/s from h0, hard ceilings
    h0["qos"] = [{"dev": "eth0", "driver": "ovs", "rate": "100mbit", "classes": [
        {"id": 2 + i, "dst": f"{train[d]}/32", "rate": r, "ceil": r}
        for i, (d, r) in enumerate(RATES.items())]}]
    name = f"tpwbw{os.getpid() % 1000}"
    servers = []
    try:
        lab = labmod.up(cluster, name, tmp_path, with_ssh=False)
        t = lab_transport(lab)
        rep = apply_plan(doc, t, probe=False)
        assert rep.exit_code == 2, rep.message
        again = apply_plan(doc, t, probe=False)
        assert again.exit_code == 0, again.message  # re-apply: every host in sync
        o = lab.ovs("h0")
        assert o.vsctl("list-br").split() == ["tpbr0"]
        assert "tpovs0" in o.vsctl("list-ports", "tpbr0").split()
        for d in RATES:
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", lab.netns(d), "iperf3", "-s", "-B", train[d], "-p",
                 "5201"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        got: dict[str, float] = {}
        for _attempt in range(3):  # a loaded machine may starve one run: keep the best
            ps = {d: subprocess.Popen(["ip", "netns", "exec", lab.netns("h0"), "iperf3", "-c",
                                       train[d], "-B", train["h0"], "-p", "5201", "-t", "4",
                                       "-J"], stdout=subprocess.PIPE, text=True)
                  for d in RATES}
            for d, p in ps.items():
                got[d] = max(got.get(d, 0.0), _received(p))
            if all(0.9 * RATES[d] <= got[d] <= 1.05 * RATES[d] for d in RATES):
                break
        for d, r in RATES.items():
            assert 0.9 * r <= got[d] <= 1.05 * r, got
        filters = nsutil.tc_json(lab.netns("h0"), "filter", "show", "dev", "eth0", "parent", "1:")
        assert len([f for f in filters if "flowid" in f.get("options", {})]) == 2
    finally:
        for s in servers:
            s.terminate()
            s.wait(10)
        pids = labovs.pids(tmp_path / name / "ovs" / "h0")
        labmod.down(name, tmp_path)
    assert all(not os.path.exists(f"/proc/{p}") or
               open(f"/proc/{p}/stat").read().split(") ")[1][0] == "Z" for p in pids)


@contextlib.contextmanager
def _ovs_lab(cluster, name: str, tmp_path):
    """The cluster as a lab with sshd, removed at the end; its OVS daemons must be gone."""
    try:
        yield labmod.up(cluster, name, tmp_path, with_ssh=True)
    finally:
        pids = labovs.pids(tmp_path / name / "ovs" / "h0")
        labmod.down(name, tmp_path)
    assert all(not os.path.exists(f"/proc/{p}") or
               open(f"/proc/{p}/stat").read().split(") ")[1][0] == "Z" for p in pids)


def _ovs_plan(name: str, dst: str, rate: str):
    """(cluster, plan) of CLUSTER named `name` whose h0 gives `dst` an OVS queue at `rate`."""
    cluster = parse_cluster(CLUSTER | {"name": name})
    doc, _ctx, _ = make_plan(cluster, parse_job(JOB), use_cache=False)
    train = {h: st["interfaces"][0]["addresses"][0].split("/")[0]
             for h, st in doc["hosts"].items()}
    doc["hosts"]["h0"]["qos"] = [{"dev": "eth0", "driver": "ovs", "rate": "100mbit",
                                  "classes": [{"id": 2, "dst": f"{train[dst]}/32",
                                               "rate": rate}]}]
    return cluster, doc


def test_ovs_plan_over_ssh_reaches_the_hosts_ovsdb(tmp_path):
    """`topoctl apply --ssh` to a lab host whose plan uses `qos.driver: ovs`: the agent runs
    under the host's sshd and finds the host's own ovsdb-server only through the `--ovsdb` the
    transport passes (the default socket does not exist in the lab), applies, re-applies as a
    no-op, and the bridge and its queues are in that ovsdb (ovs-vsctl)."""
    cluster, doc = _ovs_plan("tpwbs", "h1", "30mbit")
    name = f"tpwbs{os.getpid() % 1000}"
    with _ovs_lab(cluster, name, tmp_path) as lab:
        t = lab_ssh_transport(lab)
        try:
            assert t.ovsdb == {"h0": lab.ovsdb("h0")}
            rep = apply_plan(doc, t, probe=False, confirm_within=30)
            assert rep.exit_code == 2, rep.message
            again = apply_plan(doc, t, probe=False, confirm_within=30)
            assert again.exit_code == 0, again.message
        finally:
            t.close()
        o = lab.ovs("h0")
        assert o.vsctl("list-br").split() == ["tpbr0"]
        qos = o.vsctl("get", "port", "eth0", "qos").strip()
        assert o.vsctl("get", "qos", qos, "other_config").strip() == '{max-rate="100000000"}'
        assert 'min-rate="30000000"' in o.vsctl("--columns=other_config", "list", "queue")


def test_ovs_plan_via_ansible_reaches_the_hosts_ovsdb(tmp_path):
    """The same through the playbooks (ansible-playbook via ansible-runner against the lab's
    sshd): the lab inventory's `topo_agent_ovsdb` becomes the agent's --ovsdb on h0 only, the
    apply changes h0, the re-apply reports every host in sync (changed=0), and the queues are
    in h0's own ovsdb (ovs-vsctl). Without it the agent would find no ovsdb-server and fail."""
    cluster, doc = _ovs_plan("tpwba", "h2", "40mbit")
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(doc, sort_keys=False))
    name = f"tpwba{os.getpid() % 1000}"
    with _ovs_lab(cluster, name, tmp_path) as lab:
        inv_doc = lab_inventory(lab)
        hosts = inv_doc["all"]["hosts"]
        assert hosts["h0"]["topo_agent_ovsdb"] == lab.ovsdb("h0")
        assert "topo_agent_ovsdb" not in hosts["h1"]
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(inventory_text(inv_doc))

        def apply():
            rep = run_playbook("apply.yml", inventory, private_data_dir=tmp_path / "ansible",
                               extravars={"topo_plan": str(plan), "topo_probe": False})
            assert rep.exit_code in (0, 2), rep.message
            return rep

        # h0's apply changed it (then it was confirmed: the final event), and the re-apply
        # finds every host in sync
        first = {e.host: e.result for e in apply().events if e.phase == "apply"}
        assert first["h0"] == "changed", first
        assert {e.result for e in apply().final().values()} == {"in sync"}
        o = lab.ovs("h0")
        assert o.vsctl("list-br").split() == ["tpbr0"]
        assert 'min-rate="40000000"' in o.vsctl("--columns=other_config", "list", "queue")
