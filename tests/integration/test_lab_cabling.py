"""`topoctl lab status --plan`: the cables the kernel has (veth peers into the wire namespace,
tc redirects, HTB rates, link state) against a plan's `fabric`, on a real 4-host lab. The lab
is broken behind its back with plain `tc` / `ip` (never through the lab's own code), so the
report can only come from the kernel."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from tests import netns as nsutil
from topoctl import cli
from topoctl.lab import lab as labmod
from topoctl.spec.cluster_load import load_cluster

pytestmark = pytest.mark.netns

PLANS = Path(__file__).resolve().parents[2] / "plans"

RING = """apiVersion: topoctl/v1
kind: Plan
fabric:
  kind: direct
  mtu: 9000
  links:
    - {a: "h0:eth0", b: "h1:eth0"}
    - {a: "h1:eth1", b: "h2:eth1", bandwidth: 50mbit}
    - {a: "h2:eth2", b: "h3:eth2"}
    - {a: "h3:eth0", b: "h0:eth1"}
"""


def _cli(*args: str, root: Path) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["lab", *args, "--state-dir", str(root)])
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


@pytest.fixture
def mesh4(tmp_path):
    name = f"itc{nsutil.pid_tag()}"  # as test_lab.py's names: its leftover check reads them
    lab = labmod.up(load_cluster(PLANS / "mesh4-cluster.yaml"), name, tmp_path,
                    with_ssh=False)
    try:
        yield lab, tmp_path
    finally:
        labmod.down(name, tmp_path)
        assert not [n for n in nsutil.list_netns() if n.startswith(f"tp-{name}-")]


def test_status_against_plan_names_missing_extra_and_mismatched(mesh4):
    lab, root = mesh4
    ring = root / "ring.yaml"
    ring.write_text(RING)
    same = _cli("status", "--lab", lab.name, "--plan", str(PLANS / "mesh4-cluster.yaml"),
                root=root)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "all 6 cables" in same.stdout

    p = _cli("status", "--lab", lab.name, "--plan", str(ring), "--detailed-exitcode", root=root)
    assert p.returncode == 2, p.stdout + p.stderr  # differs: re-cabling pending
    lines = p.stdout.splitlines()
    assert any(ln.startswith("  missing     h3:eth0--h0:eth1") for ln in lines)
    assert sorted(ln.split()[1] for ln in lines if ln.startswith("  extra")) == [
        "h0:eth1--h2:eth0", "h0:eth2--h3:eth0", "h1:eth2--h3:eth1"]
    assert any(ln.startswith("  mismatched  h1:eth1--h2:eth1: h1:eth1->h2:eth1 shaped at "
                             "100mbit, planned 50mbit") for ln in lines)

    # re-cabled as planned: nothing left to report
    assert _cli("rewire", "--lab", lab.name, str(ring), root=root).returncode == 0
    p = _cli("status", "--lab", lab.name, "--plan", str(ring), root=root)
    assert p.returncode == 0 and "all 4 cables" in p.stdout, p.stdout

    # broken behind the lab's back: one direction re-shaped, another cable cut
    w = lab.layout.wire_ns
    ends = {c.a: c for c in lab.layout.cables}
    c01, c23 = ends["h0:eth0"], ends["h2:eth2"]
    nsutil.sh(["tc", "-n", w, "class", "change", "dev", c01.b_end, "parent", "1:", "classid",
               "1:1", "htb", "rate", "20mbit", "ceil", "20mbit"])
    nsutil.sh(["ip", "-n", w, "link", "set", c23.a_end, "down"])
    p = _cli("status", "--lab", lab.name, "--plan", str(ring), "--json", "--detailed-exitcode",
             root=root)
    assert p.returncode == 2
    rep = json.loads(p.stdout)["plan"]
    assert not rep["ok"] and rep["missing"] == [] and rep["extra"] == []
    bad = {m["cable"]: m["problems"] for m in rep["mismatched"]}
    assert bad == {"h0:eth0--h1:eth0": ["h0:eth0->h1:eth0 shaped at 20mbit, planned 100mbit"],
                   "h2:eth2--h3:eth2": ["cut (a wire end is down)"]}


def test_status_plan_bad_input_names_the_file(mesh4):
    lab, root = mesh4
    bad = root / "bad.yaml"
    bad.write_text("fabric: {kind: direct, links: [{a: 'h9:eth0', b: 'h1:eth0'}]}\n")
    p = _cli("status", "--lab", lab.name, "--plan", str(bad), root=root)
    assert p.returncode == 1 and f"{bad}: fabric.links[0].a: no host h9" in p.stderr
    assert "Traceback" not in p.stderr
