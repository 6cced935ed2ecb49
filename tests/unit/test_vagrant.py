"""`topoctl vagrant`: the checked-in Vagrantfile is what the generator makes, it parses as Ruby,
and each direct cable is a mirrored UDP tunnel between the right two NICs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from topoctl import cli
from topoctl.render.vagrant import nic_networks, vagrantfile
from topoctl.spec.cluster_load import load_cluster

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "vagrant" / "Vagrantfile"


def test_checked_in_vagrantfile_is_regenerated_byte_for_byte(monkeypatch):
    monkeypatch.chdir(ROOT)  # as documented: run from the repository root
    out = CHECKED_IN.with_name(".Vagrantfile.regenerated")  # same directory: same relative paths
    try:
        assert cli.main(["vagrant", "plans/topoopt12-cluster.yaml", "-o", str(out)]) == 0
        assert out.read_text() == CHECKED_IN.read_text(), \
            "regenerate: topoctl vagrant plans/topoopt12-cluster.yaml -o vagrant/Vagrantfile"
    finally:
        out.unlink(missing_ok=True)
    assert CHECKED_IN.read_text() == vagrantfile(
        load_cluster(ROOT / "plans" / "topoopt12-cluster.yaml"),
        source="plans/topoopt12-cluster.yaml")  # the pure function: same input, same bytes


def test_every_direct_cable_is_a_mirrored_udp_tunnel():
    cluster = load_cluster(ROOT / "plans" / "topoopt12-cluster.yaml")
    nets = nic_networks(cluster)
    assert len(nets) == 2 * len(cluster.fabric.links) == 48

    def opt(lines: list[str], key: str) -> str:
        return next(re.search(r"=> \"?([^\",]+)", x).group(1) for x in lines if key in x)

    for link in cluster.fabric.links:
        a, b = nets[tuple(link.a.split(":"))], nets[tuple(link.b.split(":"))]
        assert opt(a, "tunnel_local_ip") == opt(b, "tunnel_ip ")
        assert opt(b, "tunnel_local_ip") == opt(a, "tunnel_ip ")
        assert opt(a, "tunnel_local_port") == opt(b, "tunnel_port") == opt(a, "tunnel_port")
    text = CHECKED_IN.read_text()
    macs = re.findall(r':mac => "([^"]+)"', text)
    assert len(macs) == 48 == len(set(macs)) and all(m == m.lower() for m in macs)
    assert text.count("auto_config: false") == 48
    assert text.count("vm.provision :ansible") == 1 and "playbooks/site.yml" in text


def test_switched_fabric_is_one_isolated_network_per_switch_tree():
    text = vagrantfile(load_cluster(ROOT / "plans" / "leafspine8-cluster.yaml"))
    assert set(re.findall(r':libvirt__network_name => "([^"]+)"', text)) == {
        "tp-leafspine8-spine"}
    assert "tunnel" not in text and ':libvirt__forward_mode => "none"' in text


@pytest.mark.skipif(shutil.which("ruby") is None, reason="ruby not installed (make deps)")
def test_vagrantfile_is_valid_ruby():
    r = subprocess.run(["ruby", "-c", str(CHECKED_IN)], capture_output=True, text=True)
    assert r.returncode == 0 and "Syntax OK" in r.stdout, r.stderr


@pytest.mark.skipif(shutil.which("vagrant") is None,
                    reason="vagrant not installed (make deps installs it with vagrant-libvirt)")
def test_vagrant_validate(tmp_path):
    """`vagrant validate` with the libvirt provider's own checks (vagrant-libvirt installed;
    no VM is started). Vagrant's state goes to tmp_path, not beside the Vagrantfile."""
    env = {**os.environ, "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"),
           "VAGRANT_HOME": str(tmp_path / "home"), "VAGRANT_CHECKPOINT_DISABLE": "1"}
    r = subprocess.run(["vagrant", "validate"], cwd=CHECKED_IN.parent, capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0 and "validated successfully" in r.stdout, r.stdout + r.stderr
    assert not (CHECKED_IN.parent / ".vagrant").exists()


def test_bad_cluster_is_an_error_naming_the_path(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text((ROOT / "plans" / "topoopt12-cluster.yaml").read_text().replace(
        'b: "h1:eth1"', 'b: "h99:eth1"'))
    assert cli.main(["vagrant", str(bad), "-o", str(tmp_path / "V")]) == 1
    assert "h99" in capsys.readouterr().err and not (tmp_path / "V").exists()
