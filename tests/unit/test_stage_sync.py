"""A pipeline stage's gradient sync (ring, parameter server, none): the plan states it per
stage and validates it (bad kinds name the YAML path, through `topoctl explain` too); the
parameter server's schedule takes its closed-form time; the planner picks, by simulating on
the plan's own network, the server where a fat star makes it faster and packed trees on the
paths of a ring; `explain` shows each stage's hosts and sync."""

from __future__ import annotations

import copy

import pytest
import yaml

from topocontract.stages import sync_of, sync_problems, tree_schedule
from topoctl import cli
from topoctl.collective.trees.pack import plan_trees
from topoctl.collective.trees.pipeline import runtime_costs
from topoctl.collective.trees.schedule import plan_to_schedule
from topoctl.fabric.capgraph import build_capgraph
from topoctl.fabric.graph import connection_links
from topoctl.placement.runtime import allreduce_cpu, ps_cpu
from topoctl.placement.stagesync import choose_sync, ps_allreduce, sync_options, sync_tasks
from topoctl.planner import make_plan, prepare
from topoctl.render.explain import explain_text, stage_lines
from topoctl.render.validate import validate_plan
from topoctl.sim.engine import simulate
from topoctl.sim.fabric import network_from_fabric
from topoctl.sim.network import star
from topoctl.sim.routing import shortest_next_hops
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job
from topoctl.strategies.placement import search


def _stage(hosts, sync=None) -> dict:
    st = {"hosts": hosts, "ranks": list(range(len(hosts))), "ops": ["x"]}
    return st | ({"sync": sync} if sync is not None else {})


def _coll(*stages) -> dict:
    return {"algorithm": "pipeline", "stages": list(stages)}


# --- the contract ---------------------------------------------------------------------------

def test_valid_syncs_and_their_defaults():
    coll = _coll(_stage(["a", "b", "c"], {"kind": "ps", "server": "b"}),
                 _stage(["d", "e", "f"], {"kind": "ring"}))
    assert sync_problems(coll) == []
    assert sync_of(coll["stages"][0]) == ("ps", 1)
    assert sync_of(coll["stages"][1]) == ("ring", None)
    assert sync_of(_stage(["a", "b"])) == ("ring", None)  # plans without sync
    assert sync_of(_stage(["a"])) == ("none", None)
    assert sync_problems({"algorithm": "ring", "order": ["a"]}) == []  # not a pipeline


@pytest.mark.parametrize("sync, path, words", [
    ({"kind": "gossip"}, "job.collective.stages[1].sync.kind", "unknown sync kind 'gossip'"),
    ({"kind": "ps", "server": "zz"}, "job.collective.stages[1].sync.server", "not one of"),
    ({"kind": "ps"}, "job.collective.stages[1].sync.server", "not one of"),
    ({"kind": "none"}, "job.collective.stages[1].sync.kind", "2 replicas"),
    ({"kind": "ring", "server": "d"}, "job.collective.stages[1].sync.server", "unknown key"),
    ("ring", "job.collective.stages[1].sync", "expected a mapping"),
])
def test_bad_syncs_name_the_yaml_path(sync, path, words):
    coll = _coll(_stage(["a", "b"], {"kind": "ring"}), _stage(["d", "e"], sync))
    problems = sync_problems(coll)
    assert [p for p, _ in problems] == [path]
    assert words in problems[0][1]


def test_tree_syncs_validate_their_schedule():
    sched = {"world_size": 2, "trees": [{"root": 0, "rate": 1.0, "parents": [None, 0]}]}
    good = _coll(_stage(["a", "b"], {"kind": "trees", "schedule": sched}))
    assert sync_problems(good) == []
    assert tree_schedule(good["stages"][0]).world_size == 2
    bad = _coll(_stage(["a", "b", "c"], {"kind": "trees", "schedule": sched}))
    assert sync_problems(bad) == [("job.collective.stages[0].sync.schedule.world_size",
                                   "2: the stage has 3 replicas")]
    broken = _coll(_stage(["a", "b"], {"kind": "trees", "schedule": {"world_size": 2}}))
    assert [p for p, _ in sync_problems(broken)] == ["job.collective.stages[0].sync.schedule"
                                                      ".trees"]
    down = _stage(["a", "b"], {"kind": "trees", "schedule": sched}) | {"ranks": [1, 0]}
    assert [p for p, _ in sync_problems(_coll(down))] == ["job.collective.stages[0].ranks"]


def test_one_replica_cannot_ring():
    problems = sync_problems(_coll(_stage(["a"], {"kind": "ring"})))
    assert problems == [("job.collective.stages[0].sync.kind",
                         "ring: the stage has one replica (none)")]


# --- the simulator's schedules --------------------------------------------------------------

def test_ps_schedule_takes_its_closed_form_time():
    hosts = ["a", "b", "c", "d"]
    net = star(hosts, 1e9)
    s = 4e8
    sched = ps_allreduce(hosts, "b", s)
    sched.check()
    assert sched.bytes_sent() == {"a": s, "b": 3 * s, "c": s, "d": s}
    tasks, _ = sync_tasks("x", hosts, {"kind": "ps", "server": "b"}, s, ())
    # pushes share the server's downlink (3 s / B), the pulls its uplink (3 s / B)
    assert simulate(tasks, net, record=False).iteration_time == pytest.approx(6 * s / 1e9,
                                                                             rel=1e-6)
    ring, _ = sync_tasks("x", hosts, {"kind": "ring"}, s, ())
    assert simulate(ring, net, record=False).iteration_time == pytest.approx(
        2 * 3 / 4 * s / 1e9, rel=1e-6)
    assert sync_options(["a"]) == [{"kind": "none"}]


def test_ps_cpu_charges_the_server_for_every_worker():
    rc = runtime_costs(None)
    s = 1e7
    worker, server = ps_cpu(s, 4, False, rc), ps_cpu(s, 4, True, rc)
    assert server > 2.5 * worker > 0
    assert ps_cpu(s, 1, True, rc) == 0.0 and ps_cpu(0.0, 4, True, rc) == 0.0
    # a two-member server sends and receives the whole buffer once; the ring half of it twice
    assert ps_cpu(s, 2, True, rc) > allreduce_cpu(s, 2, rc)


# --- the choice, on real cluster files ------------------------------------------------------

def _cluster(links: list[tuple[str, str, str]], name: str, n: int = 4) -> dict:
    nics = {f"h{i}": 0 for i in range(n)}
    out = []
    for a, b, bw in links:
        out.append({"a": f"{a}:eth{nics[a]}", "b": f"{b}:eth{nics[b]}", "bandwidth": bw})
        nics[a] += 1
        nics[b] += 1
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": name,
            "defaults": {"nic_speed": "10gbit", "gpus": {"count": 1, "type": "small"}},
            "gpu_types": {"small": {"peak_flops": 1e11, "memory_bandwidth": 1e10,
                                    "memory": 1e9}},
            "hosts": [{"name": h, "nics": [{"name": f"eth{i}"} for i in range(max(k, 1))]}
                      for h, k in nics.items()],
            "fabric": {"kind": "direct", "mtu": 9000, "links": out}}


# a fat star: h0 holds a 10 Gbit/s cable to every other host, which are joined to each other
# by 100 Mbit/s cables (hop-count routing takes those between leaves)
FAT_STAR = [("h0", "h1", "10gbit"), ("h0", "h2", "10gbit"), ("h0", "h3", "10gbit"),
            ("h1", "h2", "100mbit"), ("h2", "h3", "100mbit"), ("h3", "h1", "100mbit")]
RING = [("h0", "h1", "1gbit"), ("h1", "h2", "1gbit"), ("h2", "h3", "1gbit"),
        ("h3", "h0", "1gbit")]


def _network(links, name):
    graph = parse_cluster(_cluster(links, name)).graph()
    return network_from_fabric(graph, shortest_next_hops(graph))


def test_the_server_wins_on_a_fat_star_and_the_ring_on_a_ring():
    hosts = ["h0", "h1", "h2", "h3"]
    size = 4e6
    sync, times = choose_sync(_network(FAT_STAR, "tss-star"), hosts, size)
    assert sync == {"kind": "ps", "server": "h0"}
    assert times["ps@h0"] < times["ring"] / 5  # 2 S / 10G against 1.5 S / 100M
    assert set(times) == {"ring", "ps@h0", "ps@h1", "ps@h2", "ps@h3"}
    sync, times = choose_sync(_network(RING, "tss-ring"), hosts, size)
    assert sync == {"kind": "ring"}
    assert times["ring"] < min(v for k, v in times.items() if k != "ring")
    # with the CPU charged (the runtime's costs), a server is busier but still wins on the star
    rc = runtime_costs(None)

    def cpu(kind, nbytes, m, server):
        return ps_cpu(nbytes, m, server, rc) if kind == "ps" else allreduce_cpu(nbytes, m, rc)

    assert choose_sync(_network(FAT_STAR, "tss-star"), hosts, size, cpu)[0]["kind"] == "ps"
    assert choose_sync(_network(RING, "tss-ring"), hosts, size, cpu)[0]["kind"] == "ring"


# --- through the planner --------------------------------------------------------------------

def _ring_cluster(n: int, memory: float) -> dict:
    # slow devices: compute dominates, so the planner replicates two stages over 4 hosts each
    return {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": f"ring{n}",
            "defaults": {"nic_speed": "1gbit", "gpus": {"count": 1, "type": "small"}},
            "gpu_types": {"small": {"peak_flops": 1e9, "memory_bandwidth": 1e10,
                                    "memory": memory}},
            "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                      for i in range(n)],
            "fabric": {"kind": "direct", "mtu": 9000, "links": [
                {"a": f"h{i}:eth0", "b": f"h{(i + 1) % n}:eth1", "bandwidth": "1gbit"}
                for i in range(n)]}}


JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "mlp-pipe",
       "model": {"catalog": "mlp", "params": {"layers": 6, "hidden": 512, "features": 256,
                                              "classes": 10}},
       "batch": {"global": 64}, "parallelism": {"data": True, "microbatches": 4},
       "strategies": ["placement"], "cost": {"method": "roofline"}}
PARAMS = 4 * (256 * 512 + 5 * 512 * 512 + 512 * 10)


@pytest.fixture(scope="module")
def hybrid_plan():
    doc, _, _ = make_plan(parse_cluster(_ring_cluster(8, 0.7 * 4 * PARAMS)), parse_job(JOB),
                          use_cache=False)
    return doc


def _two_stars() -> dict:
    """8 hosts, two fat stars (hubs h0 and h4, 10 Gbit/s to their leaves, the leaves joined by
    100 Mbit/s cables), replica r of each star cabled to replica r of the other."""
    links = []
    for b in (0, 4):
        h = [f"h{b + i}" for i in range(4)]
        links += [(h[0], h[1], "10gbit"), (h[0], h[2], "10gbit"), (h[0], h[3], "10gbit"),
                  (h[1], h[2], "100mbit"), (h[2], h[3], "100mbit"), (h[3], h[1], "100mbit")]
    links += [(f"h{i}", f"h{i + 4}", "10gbit") for i in range(4)]
    doc = _cluster(links, "tss-stars8", 8)
    doc["gpu_types"]["small"].update(peak_flops=1e9, memory=0.7 * 4 * PARAMS)
    return doc


def test_the_planner_puts_servers_on_the_star_hubs_and_trees_on_a_ring(hybrid_plan):
    doc, _, _ = make_plan(parse_cluster(_two_stars()), parse_job(JOB), use_cache=False)
    stages = doc["job"]["collective"]["stages"]
    assert [st["hosts"] for st in stages] == [["h0", "h1", "h2", "h3"], ["h4", "h5", "h6", "h7"]]
    assert [st["sync"] for st in stages] == [{"kind": "ps", "server": "h0"},
                                             {"kind": "ps", "server": "h4"}]
    for note in doc["metadata"]["collective"]["sync"]:  # the server beats the ring by far
        assert note["options_s"][f"ps@{note['server']}"] < note["options_s"]["ring"] / 10
    # on a ring of 8 a stage's 4 hosts are a path of their own cables: a tree over it uses
    # both directions of each, gloo's ring one (its closing hop runs back along the path)
    ring = hybrid_plan["job"]["collective"]["stages"]
    assert len(ring) == 2 and [st["sync"]["kind"] for st in ring] == ["trees"] * 2
    for note in hybrid_plan["metadata"]["collective"]["sync"]:
        assert note["options_s"]["trees"] < note["options_s"]["ring"]


def test_the_plan_states_each_stage_sync_and_explain_shows_it(hybrid_plan):
    doc = hybrid_plan
    stages = doc["job"]["collective"]["stages"]
    assert max(len(st["hosts"]) for st in stages) > 1  # a hybrid
    assert validate_plan(doc) == []
    notes = doc["metadata"]["collective"]["sync"]
    assert len(notes) == len(stages)
    for st, note in zip(stages, notes, strict=True):
        assert st["sync"]["kind"] == note["kind"]
        if len(st["hosts"]) == 1:
            assert st["sync"] == {"kind": "none"}
        else:  # the chosen option is the fastest simulated one
            key = (f"ps@{st['sync']['server']}" if st["sync"]["kind"] == "ps"
                   else st["sync"]["kind"])
            assert note["options_s"][key] == min(note["options_s"].values())
    text = explain_text(doc)
    for i, st in enumerate(stages):
        assert f"stage {i}: hosts {', '.join(st['hosts'])}" in text
        assert f"sync {st['sync']['kind']}" in text


def test_explain_refuses_a_bad_sync_naming_file_and_path(hybrid_plan, tmp_path, capsys):
    doc = copy.deepcopy(hybrid_plan)
    doc["job"]["collective"]["stages"][0]["sync"] = {"kind": "allgather"}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["explain", str(path)]) == 1
    err = capsys.readouterr().err
    assert "plan.yaml" in err and "job.collective.stages[0].sync.kind" in err
    assert "allgather" in err and "Traceback" not in err


def test_the_whole_iteration_is_faster_with_the_chosen_servers():
    # the shape restrictions bench/placement/hybrid_lab_check.py uses: the same 2 x 4 split,
    # once with the chosen syncs and once with rings everywhere, simulated whole
    ctx = prepare(parse_cluster(_two_stars()), parse_job(JOB), use_cache=False)
    chosen = search(ctx, "partition", "x", replicas=4, split=True)
    rings = search(ctx, "partition", "x", replicas=4, split=True, sync="ring")
    assert [st["sync"]["kind"] for st in chosen.collective["stages"]] == ["ps", "ps"]
    assert [st["sync"]["kind"] for st in rings.collective["stages"]] == ["ring", "ring"]
    assert [st["ops"] for st in chosen.collective["stages"]] == [
        st["ops"] for st in rings.collective["stages"]]
    t_ps = simulate(chosen.tasks, chosen.network, record=False).iteration_time
    t_ring = simulate(rings.tasks, rings.network, record=False).iteration_time
    assert t_ps < 0.8 * t_ring


def test_packed_trees_over_a_stage_simulate_as_a_stage_sync():
    # the building block for trees per stage (the strategies do not offer it yet:
    # docs/placement.md): on a complete graph of 4 hosts, trees packed over the stage use the
    # cables the ring leaves idle and beat both the ring and every server, network part only
    k4 = [(f"h{a}", f"h{b}", "1gbit") for a in range(4) for b in range(a + 1, 4)]
    graph = parse_cluster(_cluster(k4, "tss-k4")).graph()
    links = [(ln.a, ln.b, ln.capacity / 8.0) for ln in connection_links(graph)]
    hosts = ["h0", "h1", "h2", "h3"]
    sched = plan_to_schedule(plan_trees(build_capgraph(links, hosts)), chunk_bytes=1 << 20)
    sync, times = choose_sync(_network(k4, "tss-k4"), hosts, 4e6, trees=sched)
    assert sync["kind"] == "trees" and tree_schedule({"sync": sync}).world_size == 4
    assert times["trees"] < times["ring"] < min(v for k, v in times.items() if k[:2] == "ps")
    assert sync_problems(_coll(_stage(hosts, sync))) == []
    text = "\n".join(stage_lines({"job": {"collective": _coll(_stage(hosts, sync))}}))
    assert f"sync trees ({len(sched.trees)} trees)" in text
