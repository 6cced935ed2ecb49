"""TopoOpt in the lab, for real: the 12-host degree-4 testbed cabled as the `topoopt` plan
says (`lab up` with the plan's fabric), the plan applied by the agents, multi-hop traffic
forwarded by intermediate hosts (ip_forward, weighted multipath routes seen by `ip -j`), and a
short DDP training over it that finishes in lockstep."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.netns import ip_json, ns_exec
from topoctl import cli
from topoctl.lab import lab as labmod
from topoctl.lab import names
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import parse_job

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[2]
JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "mlp-tpo",
       "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 128, "features": 64,
                                              "classes": 10}},
       "batch": {"global": 96}, "strategies": ["topoopt"], "sync": {"bucket": "1MB"},
       "cost": {"method": "roofline"}}


@pytest.fixture
def lab_and_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(tmp_path / "labs"))
    cluster = load_cluster(ROOT / "plans" / "topoopt12-cluster.yaml")
    plan, _, _ = make_plan(cluster, parse_job(JOB), use_cache=False)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    name = f"tpo{os.getpid() % 1000}"
    lab = labmod.up(cluster, name=name, fabric=plan["fabric"], with_ssh=False)
    try:
        yield lab, plan, str(path)
    finally:
        labmod.down(name)


def test_topoopt_plan_forwards_and_trains_on_the_lab(lab_and_plan, capsys):
    lab, plan, path = lab_and_plan
    assert cli.main(["apply", path, "--lab", lab.name]) == 0
    training = plan["metadata"]["addressing"]["training"]
    ns = names.host_ns(lab.name, "h0")
    # a multipath route from the plan is in the kernel with all its next hops
    multi = next(r for r in plan["hosts"]["h0"]["routes"] if len(r.get("nexthops", [])) > 1)
    got = ip_json(ns, "route", "show", multi["dst"])
    assert got and sorted(h["dev"] for h in got[0]["nexthops"]) == sorted(
        h["dev"] for h in multi["nexthops"])
    # every host that forwards for others has ip_forward on
    for h, st in plan["hosts"].items():
        if st.get("sysctl", {}).get("ip_forward"):
            out = ns_exec(names.host_ns(lab.name, h), "sysctl", "-n",
                          "net.ipv4.ip_forward").stdout.strip()
            assert out == "1", h
    # the farthest host (3 hops on the chosen fabric) answers: intermediate hosts forward
    far = max(training, key=lambda h: len(_path(plan, "h0", h)))
    assert len(_path(plan, "h0", far)) >= 3
    r = ns_exec(ns, "ping", "-c", "2", "-W", "2", "-I", training["h0"], training[far],
                check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    capsys.readouterr()
    assert cli.main(["run", path, "--lab", lab.name, "--iterations", "3", "--json",
                     "--timeout", "900"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["synchronous"] is True
    assert len(result["ranks"]) == 12
    assert all(x["iterations"] == 3 for x in result["ranks"].values())


def _path(plan: dict, src: str, dst: str) -> list[str]:
    """Hosts on the (first) routed path src -> dst, following each host's route."""
    training = plan["metadata"]["addressing"]["training"]
    by_addr = {}
    for h, st in plan["hosts"].items():
        for i in st["interfaces"]:
            for a in i.get("addresses", []):
                by_addr[a.split("/")[0]] = h
    out, cur = [src], src
    while cur != dst and len(out) < 20:
        route = next(r for r in plan["hosts"][cur]["routes"]
                     if r["dst"] == f"{training[dst]}/32")
        via = (route.get("nexthops") or [route])[0]["via"]
        cur = by_addr[via]
        out.append(cur)
    return out[1:]


def test_no_leftovers():
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                          text=True).stdout.split() if n.startswith("tp-tpo")]
