"""`topoctl apply/status/diff/rollback` end to end: the 4-host heterogeneous lab
(tests.e2e.labs: direct cables of 50-200 Mbit/s, one host forwarding), its real sshd per host,
the real agent on every host. Host state is read back with iproute2."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.labs import (
    CLUSTER,
    HOSTS,
    PLAN,
    agent_routes,
    dumps,
    ring4_lab,
    topoctl,
    write_plan,
)
from tests.netns import sh
from topoctl.lab import lab as labmod
from topoctl.spec.cluster_load import load_cluster

pytestmark = pytest.mark.netns



@pytest.fixture
def lab(tmp_path):
    with ring4_lab(tmp_path / "labs", "e") as lab:
        yield lab


def test_apply_reapply_status_drift_repair_rollback_over_ssh(lab, capsys):
    plan = yaml.safe_load(PLAN.read_text())
    pristine = dumps(lab)
    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh") == 0
    for h in lab.cluster.hosts:
        want = plan["hosts"][h.name]["routes"]
        assert len(agent_routes(lab, h.name)) == len(want), h.name
    applied = dumps(lab)

    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh") == 0  # nothing to do
    assert dumps(lab) == applied
    assert topoctl("status", str(PLAN), "--lab", lab.name, "--ssh") == 0
    capsys.readouterr()

    victim = agent_routes(lab, "h3")[0]
    sh(["ip", "-n", lab.netns("h3"), "route", "del", victim["dst"]])
    assert topoctl("status", str(PLAN), "--lab", lab.name, "--ssh", "--json",
                   "--detailed-exitcode") == 2
    report = json.loads(capsys.readouterr().out)
    assert report["hosts"]["h3"]["result"] == "drifted"
    assert any(victim["dst"] in op for op in report["hosts"]["h3"]["detail"])
    assert {h for h, e in report["hosts"].items() if e["result"] == "in sync"} == HOSTS - {"h3"}

    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh",
                   "--detailed-exitcode") == 2  # repairs h3 only
    assert dumps(lab) == applied
    assert topoctl("rollback", str(PLAN), "--lab", lab.name, "--ssh", "--detailed-exitcode") == 2
    after = dumps(lab)
    for h in pristine:  # the agent's objects are gone; links stay up (the lab brought them up)
        assert agent_routes(lab, h) == []
        assert after[h]["rule"] == pristine[h]["rule"]
        assert after[h]["route"] == pristine[h]["route"]


def test_a_plan_whose_last_host_is_invalid_changes_no_host(lab, tmp_path, capsys):
    doc = yaml.safe_load(PLAN.read_text())
    doc["hosts"]["h3"]["routes"].append({"dst": "10.236.99.0/24", "via": "10.235.250.1"})
    before = dumps(lab)
    assert topoctl("apply", write_plan(tmp_path, doc), "--lab", lab.name) == 1
    out = capsys.readouterr().out
    assert "prepare failed on h3" in out and "not on any link" in out
    assert dumps(lab) == before


def test_a_failure_at_apply_on_one_host_rolls_every_host_back(lab, tmp_path, capsys):
    doc = yaml.safe_load(PLAN.read_text())
    # passes every check; the kernel refuses it at apply time (src is no address of h1)
    doc["hosts"]["h1"]["routes"].append(
        {"dst": "10.236.98.0/24", "via": doc["hosts"]["h1"]["routes"][0]["via"],
         "src": "10.236.97.97"})
    first = copy.deepcopy(doc)
    first["hosts"]["h1"]["routes"].pop()
    assert topoctl("apply", write_plan(tmp_path, first, "first.yaml"), "--lab", lab.name) == 0
    # a second plan that changes every host, and fails on h1
    for state in doc["hosts"].values():
        state["sysctl"] = {**state.get("sysctl", {}), "rp_filter": {"all": 1}}
    before = dumps(lab)
    capsys.readouterr()
    assert topoctl("apply", write_plan(tmp_path, doc), "--lab", lab.name, "--json") == 3
    report = json.loads(capsys.readouterr().out)
    assert report["hosts"]["h1"]["result"] == "error"
    assert "apply failed on h1" in report["message"]
    rolled = {h for h, e in report["hosts"].items() if e["result"] == "rolled back"}
    assert rolled == HOSTS - {"h1"}
    assert dumps(lab) == before


def test_dry_run_and_diff_change_nothing(lab, capsys):
    before = dumps(lab)
    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--dry-run", "--detailed-exitcode") == 2
    assert topoctl("diff", str(PLAN), "--lab", lab.name, "--detailed-exitcode") == 2
    assert "add route" in capsys.readouterr().out
    assert dumps(lab) == before


def test_unreachable_host_stops_the_rollout_before_any_change(lab, capsys):
    before = dumps(lab)
    pid = int((lab.state_dir / "run" / "sshd-h2.pid").read_text())
    os.kill(pid, 15)
    assert topoctl("apply", str(PLAN), "--lab", lab.name, "--ssh", "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["hosts"]["h2"]["result"] == "unreachable"
    assert dumps(lab) == before


def test_bad_plan_file_is_an_error_naming_the_path(tmp_path):
    doc = yaml.safe_load(PLAN.read_text())
    doc["hosts"]["h1"]["interfaces"][0]["mtu"] = "jumbo"
    r = subprocess.run([sys.executable, "-m", "topoctl.cli", "apply", write_plan(tmp_path, doc),
                        "--lab", "nosuchlab"], capture_output=True, text=True)
    assert r.returncode == 1 and "hosts.h1.interfaces[0].mtu" in r.stderr


def bare_metal(lab, tmp_path: Path) -> tuple[str, dict]:
    """A cluster file for the lab's hosts as bare metal (addresses, the lab's key and
    known_hosts, this installation's agent) and the plan as `topoctl plan` renders it for
    that cluster (its inventory copied into metadata.inventory)."""
    cl = yaml.safe_load(CLUSTER.read_text())
    cl["name"] = f"nolab{os.getpid()}"  # no lab of that name: no lab transport
    cl["inventory"] = {"user": "root", "key": str(lab.ssh_key),
                       "known_hosts": str(lab.known_hosts),
                       "agent": [sys.executable, "-m", "topoagent.cli"]}
    for h in cl["hosts"]:
        h["address"] = lab.mgmt_ip(h["name"])
    path = tmp_path / "bare-metal-cluster.yaml"
    path.write_text(yaml.safe_dump(cl, sort_keys=False))
    doc = yaml.safe_load(PLAN.read_text())
    doc["metadata"]["cluster"] = cl["name"]
    doc["metadata"]["inventory"] = load_cluster(str(path)).inventory_doc()
    return str(path), doc


def test_bare_metal_inventory_reaches_hosts_over_ssh(lab, tmp_path, capsys):
    """A cluster file with an inventory (hosts' addresses, key, known_hosts) reaches the hosts
    over SSH with `--cluster FILE`: the lab's sshd stands in for bare-metal hosts."""
    cluster, doc = bare_metal(lab, tmp_path)
    path = write_plan(tmp_path, doc)
    stores = [Path(f"/var/lib/topo-agent/netns-{lab.netns(h.name)}") for h in lab.cluster.hosts]
    try:
        assert topoctl("apply", path, "--cluster", cluster, "--json") == 0
        report = json.loads(capsys.readouterr().out)
        # over SSH every host confirms its apply (confirm-or-revert)
        assert {e["result"] for e in report["hosts"].values()} == {"confirmed"}
        assert all(agent_routes(lab, h.name) for h in lab.cluster.hosts)
        # each host kept its own history (the agent found its namespace's state directory)
        assert all((s / "history").is_dir() for s in stores)
        assert topoctl("status", path, "--cluster", cluster) == 0
        assert topoctl("rollback", path, "--cluster", cluster) == 0
        assert not any(agent_routes(lab, h.name) for h in lab.cluster.hosts)
        # a wrong host key is refused before anything is changed: rotate the known keys so
        # every address is listed with another host's key
        lines = lab.known_hosts.read_text().split("\n")
        lines = [ln for ln in lines if ln]
        keys = [ln.split(" ", 1)[1] for ln in lines]
        lab.known_hosts.write_text("".join(f"{ln.split(' ', 1)[0]} {k}\n"
                                           for ln, k in zip(lines, keys[1:] + keys[:1],
                                                            strict=True)))
        before = dumps(lab)
        capsys.readouterr()
        assert topoctl("apply", path, "--cluster", cluster, "--json") == 1
        report = json.loads(capsys.readouterr().out)
        assert {e["result"] for e in report["hosts"].values()} == {"unreachable"}
        assert dumps(lab) == before
    finally:
        for s in stores:
            sh(["rm", "-rf", str(s)], check=False)


def test_the_lab_s_ssh_files_are_root_s_alone(lab):
    """Keys, sshd configs, authorized_keys, known_hosts, ssh_config and the inventory: 0600
    (a known_hosts another user could write would let them stand in for a host)."""
    files = sorted((lab.state_dir / "ssh").iterdir()) + [lab.inventory]
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert len(files) > 8 and set(modes.values()) == {"0o600"}, modes
    assert stat.S_IMODE((lab.state_dir / "ssh").stat().st_mode) == 0o700


@pytest.mark.parametrize("verb", ["status", "apply", "run"])
def test_a_plan_cannot_choose_what_runs_on_the_hosts(lab, tmp_path, capsys, verb):
    """A plan whose metadata.inventory names another agent command (a shell command that
    would run as root on every host), alone or beside the operator's cluster file, is
    refused with exit 1 before any host is reached: the marker file it would write never
    appears, and no host changed."""
    cluster, doc = bare_metal(lab, tmp_path)
    marker = tmp_path / "pwned"
    doc["metadata"]["inventory"]["agent"] = ["/bin/sh", "-c", f"touch {marker}", "sh"]
    path = write_plan(tmp_path, doc)
    before = dumps(lab)
    capsys.readouterr()
    assert topoctl(verb, path) == 1  # the plan's inventory alone: never used
    assert "--cluster FILE" in capsys.readouterr().err
    assert topoctl(verb, path, "--cluster", cluster) == 1  # beside the operator's: differs
    err = capsys.readouterr().err
    assert "metadata.inventory.agent" in err and "refusing" in err
    # known_hosts pointing at a file the plan's author controls: refused the same way
    _, doc = bare_metal(lab, tmp_path)
    doc["metadata"]["inventory"]["known_hosts"] = str(tmp_path / "mine")
    assert topoctl(verb, write_plan(tmp_path, doc, "kh.yaml"), "--cluster", cluster) == 1
    assert "metadata.inventory.known_hosts" in capsys.readouterr().err
    assert not marker.exists()
    assert dumps(lab) == before


def test_lab_down_removes_the_agents_default_state_of_its_hosts(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(tmp_path / "labs"))
    name = f"d{os.getpid() % 10**6}"
    lab = labmod.up(load_cluster(CLUSTER), name=name, with_ssh=False)
    try:
        r = subprocess.run([sys.executable, "-m", "topoagent.cli", "--netns", lab.netns("h0"),
                            "apply", "-"], input="sysctl: {ip_forward: true}\n", text=True,
                           capture_output=True)
        assert r.returncode == 0, r.stderr
        store = Path(f"/var/lib/topo-agent/netns-{lab.netns('h0')}")
        assert (store / "history").is_dir()
    finally:
        labmod.down(name)
    assert not store.exists()
