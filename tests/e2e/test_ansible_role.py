"""The Ansible role and the read-only playbooks for real: ansible-playbook (ansible-core) through
ansible-runner against the 4-host lab's sshd, read back from the hosts.

One lab for the module (its own: tests/e2e/test_ansible.py, the apply playbooks, runs beside it
on another worker); tests run in file order and each leaves the lab as the next one expects. The
lab hosts share this machine's filesystem: the role either points at this installation's agent
(topo_agent_install_method none, as `topoctl inventory --lab` writes) or installs the project
from wheels into a per-test venv (h0 only, to keep the run short)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.ansible_lab import ROOT, lab_inventory_file, results, run
from tests.e2e.labs import HOSTS, PLAN, ring4_lab
from tests.netns import ip_json
from topoctl.rollout.ansible import AnsibleRunError

pytestmark = [pytest.mark.netns, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with ring4_lab(tmp_path_factory.mktemp("labs"), "tpr") as lab:
        yield lab


@pytest.fixture(scope="module")
def inventory(lab) -> Path:
    return lab_inventory_file(lab)


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


# two of the four hosts (the first and the last, one per rack, so the limit leaves out two):
# the role does the same on each (its per-host values come from the inventory, which the
# config files read back below check host by host), and every host in three runs of it costs
# ~4.5 s of CPU on this machine's two cores; the first test above and the apply playbooks'
# (test_ansible.py) run on all four
ROLE_HOSTS = ["h0", "h3"]


def test_role_check_mode_changes_nothing_then_installs_then_is_idempotent(lab, inventory):
    etc = lab.state_dir / "agent-etc"
    r = run(lab, inventory, "site.yml", check=True, limit=ROLE_HOSTS)
    assert r.exit_code == 2, r.message  # would change: config files and units
    assert not etc.exists()
    r = run(lab, inventory, "site.yml", limit=ROLE_HOSTS)
    assert r.exit_code == 2, r.message
    assert sorted(p.name for p in etc.iterdir()) == ROLE_HOSTS  # the limit held
    for h in ROLE_HOSTS:
        conf = yaml.safe_load((etc / h / "agent.yaml").read_text())
        assert conf["state_dir"] == str(lab.state_dir / "agent" / h)
        assert conf["ownership"]["tables"] == {"min": 100, "max": 199}
        unit = (etc / h / "topo-agent-watch.service").read_text()
        assert f"--state-dir {lab.state_dir / 'agent' / h} watch --interval 30" in unit
    r = run(lab, inventory, "site.yml", limit=ROLE_HOSTS)
    assert r.exit_code == 0 and results(r) == dict.fromkeys(ROLE_HOSTS, "in sync"), r.message


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """The project's wheel and its dependencies' wheels, as a controller would ship them."""
    out = tmp_path_factory.mktemp("wheels")
    # (no build isolation: this venv has the setuptools the project builds with, and an
    # isolated build installs it again into a throwaway environment first)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation",
                    str(ROOT), "-w", str(out)],
                   check=True, capture_output=True, text=True, timeout=900)
    return out


# the install tasks only (tag install): configuring and running the agent is the test above's
INSTALL = {"limit": ["h0"], "tags": ["install"]}


def test_role_installs_the_agent_from_wheels_into_a_venv(lab, inventory, wheels, tmp_path):
    venv = tmp_path / "venv-h0"
    extra = {"topo_agent_install_method": "wheel", "topo_agent_wheel_dir": str(wheels),
             "topo_agent_venv": str(venv), "topo_agent_command": []}
    r = run(lab, inventory, "site.yml", extravars=extra, check=True, **INSTALL)
    assert r.exit_code == 2 and not venv.exists(), r.message
    r = run(lab, inventory, "site.yml", extravars=extra, **INSTALL)
    assert r.exit_code == 2 and results(r) == {"h0": "changed"}, r.message
    shown = subprocess.run([str(venv / "bin" / "topo-agent"), "--netns", lab.netns("h0"),
                            "show"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "eth0" in shown.stdout, shown.stderr
    assert (Path(f"{venv}.wheels") / "MANIFEST").read_text().count(".whl") == len(
        list(wheels.glob("*.whl")))  # the wheels the host has, recorded after the copy
    r = run(lab, inventory, "site.yml", extravars=extra, **INSTALL)
    assert r.exit_code == 0, r.message  # nothing copied or installed again


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
