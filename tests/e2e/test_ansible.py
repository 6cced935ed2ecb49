"""The apply playbooks for real: ansible-playbook (ansible-core) through ansible-runner against the
4-host lab's sshd, the real agent on every host; host state read back with iproute2.

One lab for the module (its own: the role's tests, tests/e2e/test_ansible_role.py, run beside it
on another worker; ansible over 4 hosts on 2 cores is slow: ~10-30 s per run on a loaded
machine); tests run in file order and each leaves the lab as the next one expects. The lab
hosts share this machine's filesystem: the inventory points at this installation's agent
(topo_agent_install_method none, as `topoctl inventory --lab` writes)."""

from __future__ import annotations

import copy
import fcntl
import json
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.ansible_lab import inventory_with, lab_inventory_file, results, run
from tests.e2e.labs import HOSTS, PLAN, agent_routes, dumps, ring4_lab, write_plan
from tests.netns import sh, tc_json
from topoctl import cli

pytestmark = [pytest.mark.netns, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with ring4_lab(tmp_path_factory.mktemp("labs"), "tpa") as lab:
        yield lab


@pytest.fixture(scope="module")
def inventory(lab) -> Path:
    return lab_inventory_file(lab)


def test_apply_via_ansible_then_reapply_changes_nothing_then_check_mode_diff(lab, capsys):
    plan = yaml.safe_load(PLAN.read_text())
    assert cli.main(["apply", "--via", "ansible", "--lab", lab.name, str(PLAN),
                     "--detailed-exitcode"]) == 2
    out = capsys.readouterr().out
    assert "h3" in out and "changed" in out
    for h in HOSTS:
        assert len(agent_routes(lab, h)) == len(plan["hosts"][h]["routes"]), h
    applied = dumps(lab)

    assert cli.main(["apply", "--via", "ansible", "--lab", lab.name, str(PLAN), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {h: e["result"] for h, e in report["hosts"].items()} == dict.fromkeys(
        HOSTS, "in sync")  # changed=0 on every host
    assert dumps(lab) == applied

    victim = agent_routes(lab, "h3")[0]
    sh(["ip", "-n", lab.netns("h3"), "route", "del", victim["dst"]])
    drifted = dumps(lab)
    assert cli.main(["diff", "--via", "ansible", "--lab", lab.name, str(PLAN), "--json",
                     "--detailed-exitcode"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["hosts"]["h3"]["result"] == "changes"
    assert any(victim["dst"] in op for op in report["hosts"]["h3"]["detail"])
    assert {h for h, e in report["hosts"].items() if e["result"] == "in sync"} == HOSTS - {"h3"}
    assert dumps(lab) == drifted  # check mode changed nothing

    assert cli.main(["apply", "--via", "ansible", "--lab", lab.name, str(PLAN),
                     "--detailed-exitcode"]) == 2
    assert dumps(lab) == applied


def test_failed_apply_rolls_every_host_back_and_leaves_no_lock(lab, inventory, tmp_path):
    doc = yaml.safe_load(PLAN.read_text())
    bad = copy.deepcopy(doc)
    for state in bad["hosts"].values():  # changes every host ...
        state["sysctl"] = {**state.get("sysctl", {}), "rp_filter": {"all": 1}}
    # ... and fails on h1 at apply time: the kernel refuses a src h1 does not own
    bad["hosts"]["h1"]["routes"].append(
        {"dst": "10.236.98.0/24", "via": bad["hosts"]["h1"]["routes"][0]["via"],
         "src": "10.236.97.97"})
    before = dumps(lab)
    history = {h: sorted(p.name for p in (lab.state_dir / "agent" / h / "history").glob("*"))
               for h in HOSTS}
    r = run(lab, inventory, "apply.yml", extravars={"topo_plan": write_plan(tmp_path, bad)})
    assert r.exit_code == 1
    res = results(r)
    assert res["h1"] == "error" and "10.236.98.0/24" in " ".join(r.final()["h1"].detail)
    assert {h for h, v in res.items() if v == "rolled back"} == HOSTS - {"h1"}, res
    assert dumps(lab) == before
    for h in HOSTS:  # no transaction left: history as before, the lock free
        assert sorted(p.name for p in (lab.state_dir / "agent" / h / "history").glob("*")) \
            == history[h]
        with open(lab.state_dir / "agent" / h / "lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    r = run(lab, inventory, "apply.yml", extravars={"topo_plan": str(PLAN)})
    assert r.exit_code == 0, r.message  # a second run right after works


def test_hosts_cut_off_or_starved_by_their_apply_revert_by_themselves(lab, inventory, tmp_path):
    """apply.yml confirms each apply through a probe of the host's management path: h3's own
    state starves its SSH (an HTB class holding the controller's address at 64 kbit/s on its
    management NIC, past the guard with topo_force_mgmt) and h1 is cut off (everything it
    sends blackholed) right after the applies. Neither is confirmed; every other host is
    confirmed, then rolled back; h3 and h1 revert by themselves at their deadline. Afterwards
    every host is as before, h3's management NIC included (tc)."""
    doc = yaml.safe_load(PLAN.read_text())
    for state in doc["hosts"].values():  # changes every host
        state["sysctl"] = {**state.get("sysctl", {}), "rp_filter": {"all": 1}}
    doc["hosts"]["h3"]["qos"] = [*doc["hosts"]["h3"].get("qos", []), {
        "dev": "tpmgmt", "rate": "1gbit", "classes": [
            {"dst": lab.layout.gateway, "rate": "64kbit", "ceil": "64kbit"}]}]
    before = dumps(lab)
    h3_mgmt = tc_json(lab.netns("h3"), "qdisc", "show", "dev", "tpmgmt")
    ns5 = lab.netns("h1")
    cut = [["ip", "-n", ns5, "route", "add", "blackhole", "default", "table", "77"],
           ["ip", "-n", ns5, "rule", "add", "priority", "7", "lookup", "77"]]

    applied: set[str] = set()

    def progress(e) -> None:
        # h1 cut once every host has applied: a neighbour routing via h1 and probing its next
        # hops in its own apply would otherwise fail too, whenever it applied after the cut
        if e.phase == "apply" and e.result == "changed":
            applied.add(e.host)
            if len(applied) == len(HOSTS):
                for cmd in cut:
                    sh(cmd)

    try:
        r = run(lab, inventory, "apply.yml", progress=progress, extravars={
            "topo_plan": write_plan(tmp_path, doc), "topo_force_mgmt": True,
            "topo_confirm_within": 60})
        res = results(r)
        print(f"exit {r.exit_code}: {r.message}")
        assert r.exit_code == 1, r.message
        for h in ("h3", "h1"):
            assert r.final()[h].phase == "confirm", r.final()[h]
            assert res[h] in ("error", "unreachable"), r.final()[h]
        assert {h for h, v in res.items() if v == "rolled back"} == HOSTS - {"h3", "h1"}, res
        for h in ("h3", "h1"):
            rec = lab.state_dir / "agent" / h / "confirm.json"
            deadline = time.monotonic() + 90
            while json.loads(rec.read_text())["state"] != "reverted" \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
            assert json.loads(rec.read_text())["state"] == "reverted", h
    finally:
        sh(["ip", "-n", ns5, "rule", "del", "priority", "7"], check=False)
        sh(["ip", "-n", ns5, "route", "del", "blackhole", "default", "table", "77"],
           check=False)
    assert tc_json(lab.netns("h3"), "qdisc", "show", "dev", "tpmgmt") == h3_mgmt
    assert dumps(lab) == before


def test_plan_and_inventory_disagreeing_on_hosts_changes_nothing(lab, inventory, tmp_path,
                                                                 capsys):
    doc = yaml.safe_load(PLAN.read_text())
    doc["hosts"]["h9"] = doc["hosts"].pop("h3")
    for state in doc["hosts"].values():
        state["sysctl"] = {**state.get("sysctl", {}), "rp_filter": {"all": 1}}
    before = dumps(lab)
    r = run(lab, inventory, "apply.yml", extravars={"topo_plan": write_plan(tmp_path, doc)})
    assert r.exit_code == 1
    assert "not a host of the plan" in " ".join(r.final()["h3"].detail)
    assert dumps(lab) == before
    # topoctl names the unknown host before ansible runs
    assert cli.main(["apply", "--via", "ansible", "--lab", lab.name, str(PLAN),
                     "--hosts", "h0,h9"]) == 1
    assert "h9" in capsys.readouterr().err


def test_unreachable_host_stops_the_rollout_before_any_change(lab, tmp_path):
    doc = yaml.safe_load(PLAN.read_text())
    for state in doc["hosts"].values():
        state["sysctl"] = {**state.get("sysctl", {}), "rp_filter": {"all": 1}}
    inv = inventory_with(lab, tmp_path, {"h2": {"ansible_host": "127.0.0.1",
                                                "ansible_port": 1}})
    before = dumps(lab)
    r = run(lab, inv, "apply.yml", extravars={"topo_plan": write_plan(tmp_path, doc)})
    assert r.exit_code == 1
    assert results(r)["h2"] == "unreachable"
    assert dumps(lab) == before


def test_teardown_returns_every_host_to_its_baseline(lab, inventory):
    r = run(lab, inventory, "teardown.yml")
    assert r.exit_code == 2, r.message
    for h in HOSTS:
        assert agent_routes(lab, h) == []
        assert not (lab.state_dir / "agent" / h).exists()
        assert not (lab.state_dir / "agent-etc" / h).exists()
