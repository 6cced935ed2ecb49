"""Hosts that ask for Open vSwitch get their own ovsdb-server and ovs-vswitchd (own run
directory, database and unixctl sockets), side by side; `down` stops them with the lab."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import netns as nsutil
from topoctl.lab import lab as labmod
from topoctl.lab import ovs
from topoctl.spec.cluster_load import parse_cluster

pytestmark = pytest.mark.netns


def test_ovs_per_host(tmp_path):
    cluster = parse_cluster({
        "name": "ovs2", "defaults": {"nic_speed": "100mbit", "ovs": True},
        "hosts": [{"name": "h0", "nics": [{"name": "eth0"}]},
                  {"name": "h1", "nics": [{"name": "eth0"}]},
                  {"name": "h2", "ovs": False, "nics": [{"name": "eth0"}]}],
        "fabric": {"kind": "direct", "links": [{"a": "h0:eth0", "b": "h1:eth0"}]}})
    name = f"io{os.getpid() % 10000}"
    try:
        lab = labmod.up(cluster, name, tmp_path, with_ssh=False)
        for h in ("h0", "h1"):
            o = lab.ovs(h)
            o.bridge(f"br{h}")
            o.vsctl("add-port", f"br{h}", "eth0")
        for h in ("h0", "h1"):  # read back with the stock clients, one instance each
            o = lab.ovs(h)
            show = subprocess.run(["ovs-vsctl", f"--db={o.db}", "list-br"], capture_output=True,
                                  text=True, check=True).stdout.split()
            assert show == [f"br{h}"]
            dp = subprocess.run(["ovs-vsctl", f"--db={o.db}", "get", "bridge", f"br{h}",
                                 "datapath_type"], capture_output=True, text=True,
                                check=True).stdout.strip()
            assert dp == "netdev"
            ver = subprocess.run(["ovs-appctl", "-t", str(o.rundir / "ovs-vswitchd.ctl"),
                                  "version"], capture_output=True, text=True, check=True)
            assert "ovs-vswitchd" in ver.stdout
            # the daemons live in the host's namespace: the bridge's port shows up there
            assert f"br{h}" in {ln["ifname"] for ln in nsutil.ip_json(lab.netns(h), "link")}
        st = {h["name"]: h["ovs_pids"] for h in labmod.status(lab)["hosts"]}
        assert len(st["h0"]) == 2 and len(st["h1"]) == 2 and st["h2"] == []
        pids = st["h0"] + st["h1"]
        with pytest.raises(Exception, match="runs no Open vSwitch"):
            lab.ovs("h2")
    finally:
        labmod.down(name, tmp_path)
    assert all(not os.path.exists(f"/proc/{p}") or
               open(f"/proc/{p}/stat").read().split(") ")[1][0] == "Z" for p in pids)
    assert ovs.pids(tmp_path / name / "ovs" / "h0") == []  # state dir removed too
