"""The playbooks for real: ansible-playbook (ansible-core) through ansible-runner against the
8-host lab's sshd, the real agent on every host; host state read back with iproute2.

One lab for the module (ansible over 8 hosts on 2 cores is slow: ~10-30 s per run on a loaded
machine); tests run in file order and each leaves the lab as the next one expects. The lab
hosts share this machine's filesystem: the role either points at this installation's agent
(topo_agent_install_method none, as `topoctl inventory --lab` writes) or installs the project
from wheels into a per-test venv (h0 only, to keep the run short)."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.netns import host_dump, ip_json, sh, tc_json
from topoctl import cli
from topoctl.cli.inventory import inventory_text, lab_inventory
from topoctl.lab import lab as labmod
from topoctl.rollout.ansible import AnsibleRunError, run_playbook
from topoctl.spec.cluster_load import load_cluster

pytestmark = [pytest.mark.netns, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "plans" / "hetero8-cluster.yaml"
PLAN = ROOT / "plans" / "mlp-hetero8-plan.yaml"
HOSTS = {f"h{i}" for i in range(8)}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("labs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOCTL_LAB_DIR", str(root))
        name = f"tpa{os.getpid() % 10**5}"
        lab = labmod.up(load_cluster(CLUSTER), name=name)
        try:
            yield lab
        finally:
            labmod.down(name)


@pytest.fixture(scope="module")
def inventory(lab) -> Path:
    path = lab.state_dir / "test-inventory.yml"
    path.write_text(inventory_text(lab_inventory(lab)))
    return path


def inventory_with(lab, tmp_path: Path, host_vars: dict[str, dict]) -> Path:
    doc = lab_inventory(lab)
    for h, v in host_vars.items():
        doc["all"]["hosts"].setdefault(h, {}).update(v)
    path = tmp_path / "inventory.yml"
    path.write_text(inventory_text(doc))
    return path


def run(lab, inventory: Path, playbook: str, **kw):
    return run_playbook(playbook, inventory, private_data_dir=lab.state_dir / "ansible", **kw)


def dumps(lab) -> dict[str, dict]:
    return {h.name: host_dump(lab.netns(h.name), [n.name for n in h.nics] + ["lo"])
            for h in lab.cluster.hosts}


def agent_routes(lab, host: str) -> list[dict]:
    return [r for r in ip_json(lab.netns(host), "-4", "route", "show", "table", "all")
            if r.get("protocol") == "76"]


def results(report) -> dict[str, str]:
    return {h: e.result for h, e in report.final().items()}


def write_plan(tmp_path: Path, doc: dict, name: str = "plan.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)


def test_role_wrong_variable_type_fails_on_every_host_and_changes_nothing(lab, inventory,
                                                                          tmp_path):
    etc = tmp_path / "etc"
    r = run(lab, inventory, "site.yml", extravars={
        "topo_agent_watch_interval": "often",
        "topo_agent_config_dir": f"{etc}/{{{{ inventory_hostname }}}}"})
    assert r.exit_code == 1
    assert set(results(r).values()) == {"error"} and set(results(r)) == HOSTS
    assert all("topo_agent_watch_interval" in " ".join(e.detail)
               for e in r.final().values()), r.final()
    assert not etc.exists()


def test_role_check_mode_changes_nothing_then_installs_then_is_idempotent(lab, inventory):
    etc = lab.state_dir / "agent-etc"
    r = run(lab, inventory, "site.yml", check=True)
    assert r.exit_code == 2, r.message  # would change: config files and units
    assert not etc.exists()
    r = run(lab, inventory, "site.yml")
    assert r.exit_code == 2, r.message
    for h in HOSTS:
        conf = yaml.safe_load((etc / h / "agent.yaml").read_text())
        assert conf["state_dir"] == str(lab.state_dir / "agent" / h)
        assert conf["ownership"]["tables"] == {"min": 100, "max": 199}
        unit = (etc / h / "topo-agent-watch.service").read_text()
        assert f"--state-dir {lab.state_dir / 'agent' / h} watch --interval 30" in unit
    r = run(lab, inventory, "site.yml")
    assert r.exit_code == 0 and set(results(r).values()) == {"in sync"}, r.message


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """The project's wheel and its dependencies' wheels, as a controller would ship them."""
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(ROOT), "-w", str(out)],
                   check=True, capture_output=True, text=True, timeout=900)
    return out


def test_role_installs_the_agent_from_wheels_into_a_venv(lab, inventory, wheels, tmp_path):
    venv = tmp_path / "venv-h0"
    extra = {"topo_agent_install_method": "wheel", "topo_agent_wheel_dir": str(wheels),
             "topo_agent_venv": str(venv), "topo_agent_command": []}
    r = run(lab, inventory, "site.yml", extravars=extra, limit=["h0"], check=True)
    assert r.exit_code == 2 and not venv.exists(), r.message
    r = run(lab, inventory, "site.yml", extravars=extra, limit=["h0"])
    assert r.exit_code == 2 and results(r) == {"h0": "changed"}, r.message
    shown = subprocess.run([str(venv / "bin" / "topo-agent"), "--netns", lab.netns("h0"),
                            "show"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "eth0" in shown.stdout, shown.stderr
    r = run(lab, inventory, "site.yml", extravars=extra, limit=["h0"])
    assert r.exit_code == 0, r.message


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
    # ... and fails on h5 at apply time: the kernel refuses a src h5 does not own
    bad["hosts"]["h5"]["routes"].append(
        {"dst": "10.236.98.0/24", "via": bad["hosts"]["h5"]["routes"][0]["via"],
         "src": "10.236.97.97"})
    before = dumps(lab)
    history = {h: sorted(p.name for p in (lab.state_dir / "agent" / h / "history").glob("*"))
               for h in HOSTS}
    r = run(lab, inventory, "apply.yml", extravars={"topo_plan": write_plan(tmp_path, bad)})
    assert r.exit_code == 1
    res = results(r)
    assert res["h5"] == "error" and "10.236.98.0/24" in " ".join(r.final()["h5"].detail)
    assert {h for h, v in res.items() if v == "rolled back"} == HOSTS - {"h5"}, res
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
    management NIC, past the guard with topo_force_mgmt) and h5 is cut off (everything it
    sends blackholed) right after the applies. Neither is confirmed; every other host is
    confirmed, then rolled back; h3 and h5 revert by themselves at their deadline. Afterwards
    every host is as before, h3's management NIC included (tc)."""
    doc = yaml.safe_load(PLAN.read_text())
    for state in doc["hosts"].values():  # changes every host
        state["sysctl"] = {**state.get("sysctl", {}), "rp_filter": {"all": 1}}
    doc["hosts"]["h3"]["qos"] = [*doc["hosts"]["h3"].get("qos", []), {
        "dev": "tpmgmt", "rate": "1gbit", "classes": [
            {"dst": lab.layout.gateway, "rate": "64kbit", "ceil": "64kbit"}]}]
    before = dumps(lab)
    h3_mgmt = tc_json(lab.netns("h3"), "qdisc", "show", "dev", "tpmgmt")
    ns5 = lab.netns("h5")
    cut = [["ip", "-n", ns5, "route", "add", "blackhole", "default", "table", "77"],
           ["ip", "-n", ns5, "rule", "add", "priority", "7", "lookup", "77"]]

    applied: set[str] = set()

    def progress(e) -> None:
        # h5 cut once every host has applied: a neighbour routing via h5 and probing its next
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
        for h in ("h3", "h5"):
            assert r.final()[h].phase == "confirm", r.final()[h]
            assert res[h] in ("error", "unreachable"), r.final()[h]
        assert {h for h, v in res.items() if v == "rolled back"} == HOSTS - {"h3", "h5"}, res
        for h in ("h3", "h5"):
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
    doc["hosts"]["h9"] = doc["hosts"].pop("h7")
    for state in doc["hosts"].values():
        state["sysctl"] = {**state.get("sysctl", {}), "rp_filter": {"all": 1}}
    before = dumps(lab)
    r = run(lab, inventory, "apply.yml", extravars={"topo_plan": write_plan(tmp_path, doc)})
    assert r.exit_code == 1
    assert "not a host of the plan" in " ".join(r.final()["h7"].detail)
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


def test_facts_fragment_matches_the_lab(lab, inventory, tmp_path):
    out = tmp_path / "fragment.yaml"
    r = run(lab, inventory, "facts.yml", extravars={"topo_facts_out": str(out)})
    assert r.exit_code == 2, r.message  # the fragment written on the controller
    frag = yaml.safe_load(out.read_text())
    got = {h["name"]: {n["name"]: n["mac"] for n in h["nics"]} for h in frag["hosts"]}
    want = {h.name: {n["ifname"]: n["address"] for n in ip_json(lab.netns(h.name), "link")
                     if n["ifname"] in {x.name for x in h.nics}}
            for h in lab.cluster.hosts}
    assert got == want
    assert all(h["address"] == lab.mgmt_ip(h["name"]) for h in frag["hosts"])


def test_runner_pitfalls_are_errors_not_silent_success(lab, inventory, tmp_path, monkeypatch):
    with pytest.raises(AnsibleRunError, match="event_handler must return True"):
        run(lab, inventory, "facts.yml", limit=["h0"], keep_event=lambda ev: False,
            extravars={"topo_facts_out": str(tmp_path / "f.yaml")})
    with pytest.raises(AnsibleRunError, match="matched no host"):
        run(lab, inventory, "apply.yml", limit=["nosuchhost"],
            extravars={"topo_plan": str(PLAN)})
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(AnsibleRunError, match="ansible-playbook .*did not run"):
        run(lab, inventory, "apply.yml", bin_dir=empty, extravars={"topo_plan": str(PLAN)})
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    with pytest.raises(AnsibleRunError, match="ansible-playbook not found"):
        run(lab, inventory, "apply.yml", extravars={"topo_plan": str(PLAN)})


def test_teardown_returns_every_host_to_its_baseline(lab, inventory):
    r = run(lab, inventory, "teardown.yml")
    assert r.exit_code == 2, r.message
    for h in HOSTS:
        assert agent_routes(lab, h) == []
        assert not (lab.state_dir / "agent" / h).exists()
        assert not (lab.state_dir / "agent-etc" / h).exists()
