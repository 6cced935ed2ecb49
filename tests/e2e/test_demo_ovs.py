"""The demo's Open vSwitch row (`bench/demo/ovs.py`), reduced: a 3-host ring with every host
`ovs: true`, the MLP job planned with `baseline+bandwidth`, applied over the lab's SSH, trained for
3 iterations, then read back with the stock tools before the lab goes: ovs-vsctl shows the QoS
and its queue at the planned rate, tc shows the agent's u32 filter and the bytes the training
sent through the per-destination HTB class. That needs the three bridges not to switch between
their NICs (a ring of bridges is an L2 loop) and the planned ring direction to be gloo's (else
the classes sit on the idle direction). The lab and its OVS daemons are gone afterwards, also
when the run fails."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from topoagent.state.values import parse_rate
from topoctl.lab import lab as labmod
from topoctl.lab import netops
from topoctl.lab import ovs as labovs
from topoctl.lab.names import prefix

pytestmark = pytest.mark.netns

HOSTS = ("h0", "h1", "h2")
CLUSTER = {
    "apiVersion": "topoctl/v1", "kind": "Cluster", "name": "ring3",
    "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "cpu"}},
    "hosts": [{"name": h, "nics": [{"name": "eth0"}, {"name": "eth1"}]} for h in HOSTS],
    "fabric": {"kind": "direct", "mtu": 9000, "links": [
        {"a": f"h{i}:eth0", "b": f"h{(i + 1) % 3}:eth1", "bandwidth": "100mbit"}
        for i in range(3)]},
}
JOB = {
    "apiVersion": "topoctl/v1", "kind": "Job", "name": "mlp-ovs",
    "model": {"catalog": "mlp", "params": {"layers": 2, "hidden": 512, "features": 256,
                                           "classes": 10}},
    "batch": {"global": 48}, "parallelism": {"data": True}, "strategies": ["baseline"],
    "cost": {"method": "roofline"},
}
ITERATIONS = 3


@pytest.fixture
def demo_modules():
    from bench.demo import ovs as demo_ovs
    from bench.demo import run as demo

    return demo, demo_ovs


def _sent(lab, host: str, dev: str, handle: str) -> int:
    out = lab.exec(host, ["tc", "-s", "class", "show", "dev", dev], check=True).stdout
    m = re.search(rf"class htb {re.escape(handle)} .*?\n\s*Sent (\d+) bytes", out)
    return int(m.group(1)) if m else 0


def test_demo_ovs_row_trains_through_the_ovs_queues(tmp_path, monkeypatch, demo_modules):
    demo, demo_ovs = demo_modules
    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(tmp_path / "labs"))
    cluster_file = tmp_path / "ring3-cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(CLUSTER))
    name = f"tdo{os.getpid() % 10**5}"
    seen: dict = {}

    def check(lab, plan, row):
        seen["pids"] = [p for h in HOSTS
                        for p in labovs.pids(lab.state_dir / "ovs" / h)]
        assert seen["pids"], "no OVS daemons found for the lab's hosts"
        grad = plan["metadata"]["model"]["parameters_bytes"]
        for host, st in plan["hosts"].items():
            (q,) = st["qos"]
            assert q["driver"] == "ovs"
            (c,) = q["classes"]  # one destination: its ring neighbour
            o = lab.ovs(host)
            assert o.vsctl("list-br").split() == ["tpbr0"]
            qos = o.vsctl("get", "port", q["dev"], "qos").strip()
            assert o.vsctl("get", "qos", qos, "type").strip() == "linux-htb"
            queue = o.vsctl("get", "qos", qos, f"queues:{c['id']}").strip()
            rate = o.vsctl("get", "queue", queue, "other_config:min-rate").strip().strip('"')
            assert int(rate) == parse_rate(c["rate"])  # the planned rate, as an integer
            handle = f"1:{c['id'] + 1:x}"
            filters = lab.exec(host, ["tc", "filter", "show", "dev", q["dev"], "parent", "1:"],
                               check=True).stdout
            assert f"flowid {handle}" in filters
            # the ring: each iteration sends 2(n-1)/n of the gradient to the host's ring
            # neighbour, all of it through that destination's class
            sent = _sent(lab, host, q["dev"], handle)
            assert sent >= 0.9 * ITERATIONS * 4 / 3 * grad, (host, q["dev"], sent, grad)
            (mine,) = [r for r in row["ovs_classes"] if r["host"] == host]
            assert mine["queue"] is not None and mine["filter"]
            # the demo read the same counter a moment before this check: no more than now (a
            # stray segment after the training may still add a few bytes), and the training's
            assert sent >= mine["bytes"] >= 0.9 * ITERATIONS * 4 / 3 * grad, (mine, sent)
            assert mine["bytes"] >= 0.9 * mine["dev_bytes"]
        seen["checked"] = True

    row = demo_ovs.ovs_row(cluster_file, JOB, ITERATIONS, tmp_path, name, demo.measure,
                           lambda _msg: None, check)
    assert seen.get("checked")
    assert row["strategy"] == "baseline+bandwidth (ovs)" and row["measured"] > 0
    assert row["predicted"] > 0
    # the lab and its OVS daemons are gone
    assert not netops.list_netns(prefix(name))
    assert all(not os.path.exists(f"/proc/{p}") or
               open(f"/proc/{p}/stat").read().split(") ")[1][0] == "Z" for p in seen["pids"])
    assert name not in labmod.list_labs()


def test_demo_ovs_row_removes_the_lab_when_the_run_fails(tmp_path, monkeypatch, demo_modules):
    """A failure inside the run (training fails: demo.measure's SystemExit) still takes the
    lab and its OVS daemons down."""
    _demo, demo_ovs = demo_modules
    monkeypatch.setenv("TOPOCTL_LAB_DIR", str(tmp_path / "labs"))
    cluster_file = tmp_path / "ring3-cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(CLUSTER))
    name = f"tdf{os.getpid() % 10**5}"
    pids: list[int] = []

    def failing(_name, _plan, _transport, _iterations):
        pids.extend(p for h in HOSTS
                    for p in labovs.pids(tmp_path / "labs" / name / "ovs" / h))
        raise SystemExit("training failed: injected")

    with pytest.raises(SystemExit, match="injected"):
        demo_ovs.ovs_row(cluster_file, JOB, 1, tmp_path, name, failing, lambda _m: None)
    assert pids
    assert not netops.list_netns(prefix(name))
    assert all(not os.path.exists(f"/proc/{p}") or
               open(f"/proc/{p}/stat").read().split(") ")[1][0] == "Z" for p in pids)
