"""playbooks/ pass `ansible-playbook --syntax-check` and ansible-lint (production profile);
`topoctl inventory` writes what Ansible reads; runner events map onto rollout events."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from topoctl import cli
from topoctl.rollout.ansible import event_of

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"
ALL = ["site.yml", "apply.yml", "facts.yml", "teardown.yml"]


def tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.skip(f"{name} not installed (pip install -e '.[ansible]')")
    return found


def test_syntax_check():
    r = subprocess.run([tool("ansible-playbook"), "-i", "localhost,", "--syntax-check", *ALL],
                       cwd=PLAYBOOKS, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ansible_lint_production_profile():
    r = subprocess.run([tool("ansible-lint"), "--offline", "--profile", "production",
                        "--nocolor", *ALL], cwd=PLAYBOOKS, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_role_variable_has_a_spec():
    defaults = yaml.safe_load((PLAYBOOKS / "roles/topo_agent/defaults/main.yml").read_text())
    specs = yaml.safe_load((PLAYBOOKS / "roles/topo_agent/meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    assert all(options[k]["default"] == v for k, v in defaults.items())


CLUSTER = {
    "apiVersion": "topoctl/v1", "kind": "Cluster", "name": "rack1",
    "defaults": {"nic_speed": "100gbit"},
    "inventory": {"user": "ops", "key": "/etc/topoctl/id", "known_hosts": "/etc/topoctl/kh",
                  "agent": ["/opt/topo/bin/topo-agent"]},
    "hosts": [{"name": "a", "rack": "r1", "address": "192.0.2.1", "ovs": True,
               "nics": [{"name": "eth1"}]},
              {"name": "b", "rack": "r1", "address": "192.0.2.2", "nics": [{"name": "eth1"}]}],
    "fabric": {"kind": "direct", "links": [{"a": "a:eth1", "b": "b:eth1"}]},
}


def test_inventory_from_a_cluster_file(tmp_path):
    src = tmp_path / "c.yaml"
    src.write_text(yaml.safe_dump(CLUSTER))
    out = tmp_path / "inv.yml"
    assert cli.main(["inventory", str(src), "-o", str(out)]) == 0
    inv = yaml.safe_load(out.read_text())["all"]
    assert inv["hosts"]["a"] == {"ansible_host": "192.0.2.1", "topo_agent_require_ovs": True}
    assert inv["vars"]["ansible_user"] == "ops"
    assert "StrictHostKeyChecking=yes" in inv["vars"]["ansible_ssh_common_args"]
    assert inv["vars"]["topo_agent_command"] == ["/opt/topo/bin/topo-agent"]
    assert inv["children"] == {"rack_r1": {"hosts": {"a": {}, "b": {}}}}
    r = subprocess.run([tool("ansible-inventory"), "-i", str(out), "--list"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["_meta"]["hostvars"]["b"]["ansible_host"] == "192.0.2.2"


def test_inventory_without_addresses_names_each_host(tmp_path, capsys):
    doc = {**CLUSTER, "hosts": [{k: v for k, v in h.items() if k != "address"}
                                for h in CLUSTER["hosts"]]}
    src = tmp_path / "c.yaml"
    src.write_text(yaml.safe_dump(doc))
    assert cli.main(["inventory", str(src), "-o", str(tmp_path / "inv.yml")]) == 1
    err = capsys.readouterr().err
    assert "hosts[0].address" in err and "hosts[1].address" in err
    assert not (tmp_path / "inv.yml").exists()


def ev(kind: str, task: str, **res) -> dict:
    return {"event": kind, "event_data": {"host": "h1", "task": task, "res": res,
                                          "duration": 0.5}}


def test_runner_events_become_rollout_events():
    ops = json.dumps({"ok": True, "operations": [{"what": "add route 10.0.0.0/24"}]})
    e = event_of(ev("runner_on_ok", "Prepare (diff against the host)", rc=2, stdout=ops))
    assert (e.phase, e.result, e.detail) == ("prepare", "changes", ["add route 10.0.0.0/24"])
    e = event_of(ev("runner_on_ok", "Apply", rc=1, stdout=json.dumps(
        {"ok": False, "error": "x", "problems": [{"path": "", "message": "kernel said no"}]})))
    assert (e.phase, e.result, e.detail) == ("apply", "error", ["kernel said no"])
    e = event_of(ev("runner_on_unreachable", "Prepare (diff against the host)",
                    msg="Connection refused"))
    assert e.result == "unreachable" and "refused" in e.detail[0]
    assert event_of(ev("runner_on_ok", "Apply")) is None  # skipped by `when`
    assert event_of(ev("runner_on_ok", "Read the plan")) is None
    e = event_of(ev("runner_on_failed", "Every host of the play is in the plan", msg="h1: no"))
    assert e.result == "error" and e.detail == ["h1: no"]
