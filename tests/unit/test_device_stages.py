"""Pipelines and placement over devices, not hosts (issue 51, item 3): a stage is a set of
devices on a grid of hosts x local devices, the simulator costs the activations between two
devices of one host on the intra-host link, and the plan states each stage's ranks. Before,
`pipeline` and `placement` refused every cluster with `gpus.count` > 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from topoctl.collective.trees.pipeline import runtime_costs
from topoctl.labprofile import DEFAULT_LAB
from topoctl.pipeline.gpipe import Measured, lab_network
from topoctl.planner import evaluate, lower_bound, prepare, score
from topoctl.sim.devices import split_device
from topoctl.sim.fabric import network_from_fabric
from topoctl.sim.routing import shortest_next_hops
from topoctl.sim.tasks import Collective, Transfer
from topoctl.spec.cluster_load import load_cluster, parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.devices import (
    device_groups,
    device_network,
    stage_device_groups,
    stage_shapes,
)
from topoctl.strategies.placement import search

PLANS = Path(__file__).resolve().parents[2] / "plans"


def _cluster(link: str | None = None, **gpus) -> dict:
    """2 hosts x 2 V100 on one 10 Gbit/s switch (`link`: the intra-host bandwidth)."""
    g = {"count": 2, "type": "V100"} | gpus
    if link is not None:
        g["link"] = {"bandwidth": link}
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "c2x2",
            "defaults": {"nic_speed": "10gbit", "gpus": g},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}]} for i in range(2)],
            "fabric": {"kind": "switched", "switches": [{"name": "sw"}]}}


def _ctx(cluster, batch: int = 384):
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    job["batch"]["global"] = batch
    return prepare(cluster, parse_job(job), use_cache=False)


def test_stage_device_sets_over_the_grid():
    """Stages over 2 hosts x 2 devices: whole hosts (replicas along local rank), one device
    of each host (replicas across hosts), or one device each; members in rank order."""
    devs = [["h0/g0", "h0/g1"], ["h1/g0", "h1/g1"]]
    assert stage_shapes(2, 2) == [(1, 2), (1, 1), (2, 1)]
    assert stage_shapes(4, 1) == [(1, 1), (2, 1)]  # one device per host: as before
    assert stage_shapes(4, 8)[:4] == [(1, 8), (1, 4), (1, 2), (1, 1)]
    assert (4, 8) not in stage_shapes(4, 8) and len(stage_shapes(4, 8)) == 11
    assert stage_device_groups(devs, 1, 2) == [["h0/g0", "h0/g1"], ["h1/g0", "h1/g1"]]
    assert stage_device_groups(devs, 2, 1) == [["h0/g0", "h1/g0"], ["h0/g1", "h1/g1"]]
    assert stage_device_groups(devs, 1, 1) == [["h0/g0"], ["h0/g1"], ["h1/g0"], ["h1/g1"]]
    assert stage_device_groups([["a"], ["b"], ["c"], ["d"]], 2, 1) == [["a", "b"], ["c", "d"]]
    with pytest.raises(ValueError):
        stage_device_groups(devs, 1, 3)


@pytest.mark.parametrize("strategy", ["pipeline", "placement"])
def test_two_hosts_of_two_devices_plan_a_pipeline(strategy):
    """Both strategies plan the 2 x 2 cluster (before: refused, `gpus.count: 2`); every stage
    states one rank per replica, the hosts those ranks run on, each rank in one stage at
    most, and the bound `explain` prints holds."""
    ctx = _ctx(parse_cluster(_cluster()))
    e = evaluate(ctx, strategy)
    coll = e.strategy.collective
    assert coll["algorithm"] == "pipeline"
    seen = [r for st in coll["stages"] for r in st["ranks"]]
    assert len(seen) == len(set(seen)) and set(seen) <= {0, 1, 2, 3}
    for st in coll["stages"]:
        assert len(st["ranks"]) == coll["replicas"]
        assert st["hosts"] == [f"h{r // 2}" for r in st["ranks"]]
    assert set(e.strategy.notes["candidates"]) == {
        "2x2 (1 hosts x 2 devices)", "4x1 (1 hosts x 1 devices)", "2x2 (2 hosts x 1 devices)"}
    assert lower_bound(ctx, e.strategy)[0] <= e.result.iteration_time * (1 + 1e-9)


def _stage_plan(link: str | None, stage: tuple[int, int]):
    ctx = _ctx(parse_cluster(_cluster(link)))
    s = search(ctx, "partition", "pipeline", split=True, stage=stage)
    return ctx, s, score(ctx, s).iteration_time


def test_stages_inside_a_host_send_activations_over_the_intra_host_link():
    """Stages of one device of each host (replicas across hosts): every activation and its
    gradient goes between two devices of one host over the intra-host link, the stage sync
    across the hosts; the prediction follows the intra-host link's speed."""
    ctx, s, fast = _stage_plan(None, (2, 1))
    assert [st["ranks"] for st in s.collective["stages"]] == [[0, 2], [1, 3]]
    assert [st["hosts"] for st in s.collective["stages"]] == [["h0", "h1"], ["h0", "h1"]]
    moves = [t for t in s.tasks if isinstance(t, Transfer)]
    assert moves
    bw = ctx.cluster.device_link("h0").bandwidth
    for t in moves:
        h, _ = split_device(t.src)
        assert split_device(t.dst)[0] == h
        ((_, path),) = s.network.routes(t.src, t.dst)
        assert path == (f"{t.src}>{h}", f"{h}>{t.dst}")
        assert all(s.network.links[x].capacity == bw for x in path)
    syncs = [t for t in s.tasks if isinstance(t, Collective)]
    assert {frozenset(t.schedule.members) for t in syncs} == {
        frozenset({"h0/g0", "h1/g0"}), frozenset({"h0/g1", "h1/g1"})}
    _, _, slow = _stage_plan("100mbit", (2, 1))
    assert slow > fast * 1.5  # the activations crawl over a slow intra-host link


def test_stages_of_whole_hosts_send_along_the_rails():
    """Stages of a whole host (replicas along local rank): replica i sends from device i of
    one host to device i of the next, the stage's sync runs inside the host."""
    _, s, _ = _stage_plan(None, (1, 2))
    assert [st["ranks"] for st in s.collective["stages"]] == [[0, 1], [2, 3]]
    moves = [t for t in s.tasks if isinstance(t, Transfer)]
    assert moves
    for t in moves:
        (a, i), (b, j) = split_device(t.src), split_device(t.dst)
        assert a != b and i == j
    syncs = [t for t in s.tasks if isinstance(t, Collective)]
    assert {frozenset(t.schedule.members) for t in syncs} == {
        frozenset({"h0/g0", "h0/g1"}), frozenset({"h1/g0", "h1/g1"})}


@pytest.mark.parametrize("strategy", ["pipeline", "placement"])
def test_the_rail_optimised_example_plans_stages_of_devices(strategy):
    """4 hosts x 8 H100 (plans/rails4x8): eleven stage shapes scored, stages of whole sets of
    devices, disjoint, each replica's ranks on the hosts the stage names; the bound holds."""
    ctx = _ctx(load_cluster(PLANS / "rails4x8-cluster.yaml"))
    e = evaluate(ctx, strategy)
    coll, notes = e.strategy.collective, e.strategy.notes
    assert len(notes["candidates"]) == 11
    ranks = [r for st in coll["stages"] for r in st["ranks"]]
    assert len(ranks) == len(set(ranks)) and set(ranks) <= set(range(32))
    for st, devs in zip(coll["stages"], notes["devices"], strict=True):
        assert [ctx.ranks[split_device(d)[0]][split_device(d)[1]] for d in devs] == st["ranks"]
        assert st["hosts"] == [split_device(d)[0] for d in devs]
    assert lower_bound(ctx, e.strategy)[0] <= e.result.iteration_time * (1 + 1e-9)


def test_the_lab_network_shapes_cables_not_a_hosts_loopback():
    """In the lab model (`lab_network`) a cable gets the shaper's token credit, a device's
    link to its host (the namespace's loopback, which the lab does not shape) none; the
    pooled cores are the devices' own."""
    ctx = _ctx(parse_cluster(_cluster()))
    hops = shortest_next_hops(ctx.fabric, required=ctx.hosts)
    net = device_network(ctx, network_from_fabric(ctx.fabric, hops))
    devs = [d for grp in device_groups(ctx) for d in grp]
    meas = Measured({}, runtime_costs(None), lab=DEFAULT_LAB)
    lab = lab_network(net, devs, meas, ctx.fabric.mtu)
    inside = [ln for ln in lab.links.values() if "/g" in ln.src + ln.dst]
    cables = [ln for ln in lab.links.values() if "/g" not in ln.src + ln.dst]
    assert len(inside) == 8 and all(ln.credit == 0 for ln in inside)
    assert cables and all(ln.credit > 0 for ln in cables)
    assert lab.cpu_pool.devices == frozenset(devs)


def test_a_device_computes_at_its_hosts_speed():
    """`hosts[].speed` of a cpu host (per device) applies to each of its devices' stage
    compute in the simulator, as the bound counts it: a slow h0 slows the pipeline and the
    bound holds (before, device nodes ran at speed 1 and the plan could undercut its
    bound)."""
    times = {}
    for speed in (1.0, 0.25):
        doc = _cluster(type="cpu")
        doc["hosts"][0]["speed"] = speed
        ctx = _ctx(parse_cluster(doc))
        s = search(ctx, "partition", "pipeline", split=True, stage=(1, 1))
        times[speed] = score(ctx, s).iteration_time
        assert s.network.speed.get("h0/g0") == speed
        assert lower_bound(ctx, s)[0] <= times[speed] * (1 + 1e-9)
    assert times[0.25] > times[1.0] * 1.5
