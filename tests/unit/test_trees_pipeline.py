"""The lock-step runtime's cost model (topoctl.collective.trees.pipeline) and its use by the
`trees` strategy."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from tests.treegen import random_trees
from topoctl.collective.trees.pipeline import (
    RuntimeCosts,
    choose_chunks,
    leave_fractions,
    link_rows,
    link_steps,
    predict,
    runtime_costs,
    tree_shape,
)
from topoctl.labprofile import LabProfile, machine_profile, profile_from_calibration
from topotrain.collectives import TreeSchedule
from topotrain.collectives.program import compile_program

PLANS = Path(__file__).resolve().parents[2] / "plans"
FREE = RuntimeCosts(per_message_s=0.0, per_piece_s=0.0, wire_bytes_per_s=1e30,
                    reduce_bytes_per_s=1e30, copy_bytes_per_s=1e30)


def random_schedule(world: int, ntrees: int, seed: int) -> TreeSchedule:
    return TreeSchedule.model_validate(
        {"world_size": world, "trees": random_trees(world, ntrees, seed, (0.5, 2.0))})


def shape_of(s: TreeSchedule):
    return tree_shape([t.parents for t in s.trees], [t.rate for t in s.trees])


@pytest.mark.parametrize("world,ntrees,chunks", [(2, 1, 1), (5, 3, 4), (8, 16, 9), (7, 8, 30)])
def test_message_count_is_the_compiled_programs(world, ntrees, chunks):
    """The model counts exactly the messages the compiled program posts (large partitions: no
    empty chunks) on the busiest rank."""
    s = random_schedule(world, ntrees, seed=world + ntrees)
    numel = 1_000_000
    ops = max(compile_program(s, numel, r, chunks).ops() for r in range(world))
    p = predict(shape_of(s), 4.0 * numel, 1e6, chunks, RuntimeCosts(), 1)
    assert p.messages == ops
    assert p.steps == chunks + 2 * max(t.height() for t in s.trees) - 1


def test_parts_move_in_opposite_directions_and_the_choice_is_the_minimum():
    s = random_schedule(8, 16, seed=1)
    sh = shape_of(s)
    m, rate = 16e6, 40e6
    nets = [predict(sh, m, rate, c, RuntimeCosts(), 8).network_s for c in (1, 4, 16, 64)]
    cpus = [predict(sh, m, rate, c, RuntimeCosts(), 8).cpu_s for c in (1, 4, 16, 64)]
    assert nets == sorted(nets, reverse=True) and cpus == sorted(cpus)
    best = choose_chunks(sh, m, rate, RuntimeCosts(), 8)

    def cost(p):  # the chunk choice keeps CPU headroom: it minimises the sum of the parts
        return p.network_s + p.cpu_s

    assert all(cost(best) <= cost(predict(sh, m, rate, c, RuntimeCosts(), 8)) + 1e-12
               for c in range(1, 200))
    assert best == choose_chunks(sh, m, rate, RuntimeCosts(), 8)  # deterministic
    # free CPU: as deep as 4 KiB chunks allow; very expensive messages: one chunk
    assert choose_chunks(sh, m, rate, FREE, 8).chunks == int(max(sh.fractions) * m // 4096)
    slow = RuntimeCosts(per_message_s=1.0)
    assert choose_chunks(sh, m, rate, slow, 8).chunks == 1


def test_cores_shared_by_colocated_ranks_stretch_the_cpu_part():
    sh = shape_of(random_schedule(8, 4, seed=2))
    rc = RuntimeCosts()
    alone = predict(sh, 8e6, 1e7, 10, rc, 1, lab=LabProfile(cores=2)).cpu_s
    lab = predict(sh, 8e6, 1e7, 10, rc, 8, lab=LabProfile(cores=2)).cpu_s
    big = predict(sh, 8e6, 1e7, 10, rc, 8, lab=LabProfile(cores=64)).cpu_s
    # many cores: no stretching, but a lab's wire bytes still cost the cable emulation
    assert lab > 2 * alone and alone < big < lab
    free_emulation = LabProfile(cores=64, emulation_bytes_per_s=1e30)
    assert predict(sh, 8e6, 1e7, 10, rc, 8, lab=free_emulation).cpu_s == pytest.approx(alone)
    # the default profile is today's lab: 2 cores, 0.62 GB per core-second of emulation
    assert predict(sh, 8e6, 1e7, 10, rc, 8) == predict(sh, 8e6, 1e7, 10, rc, 8,
                                                      lab=LabProfile(2, 0.62e9))


def test_runtime_costs_from_a_calibration_document():
    assert runtime_costs(None).source == "default"
    doc = {"per_message_s": 1e-4, "wire_bytes_per_s": 1e9, "reduce_bytes_per_s": 2e9,
           "copy_bytes_per_s": 3e9, "cores": 4, "key": "abc"}
    c = runtime_costs(doc)
    assert (c.per_message_s, c.source) == (1e-4, "calibrated:abc")


def test_lab_profile_from_a_calibration_document_or_the_defaults():
    """The lab's cores and emulation cost come from the calibration (the emulation cost only
    when it has one); without one, the defaults, and `--no-cache` never reads the machine."""
    doc = {"per_message_s": 1e-4, "wire_bytes_per_s": 1e9, "reduce_bytes_per_s": 2e9,
           "copy_bytes_per_s": 3e9, "cores": 4, "key": "abc"}
    p = profile_from_calibration(doc)
    assert (p.cores, p.emulation_bytes_per_s, p.source) == (4, 0.62e9, "calibrated:abc")
    assert profile_from_calibration(doc | {"emulation_bytes_per_s": 0.3e9}) \
        .emulation_bytes_per_s == 0.3e9
    assert profile_from_calibration(None, 16).cores == 16
    assert profile_from_calibration(None) == LabProfile() == machine_profile(use_cache=False)
    assert LabProfile().wire_rate(5.5e9) == 1.24e9 and LabProfile().wire_rate(1e9) == 1e9


def test_lab_profile_credit_is_the_labs_cable_credit():
    """The profile's cable credit is what the lab shapes its cables with."""
    from topoctl.lab.commands import BURST_S, cable_credit_s

    p = LabProfile()
    assert p.burst_s == BURST_S
    for rate in (1e5, 5e6, 36e6, 200e6, 1e9, 12345678.9, 2.1e9):
        for mtu in (1500, 4000, 9000):
            assert p.cable_credit_s(rate, mtu) == cable_credit_s(rate, mtu)
    assert p.cable_credit_s(0.0, 9000) == 0.0
    assert LabProfile(burst_s=0.008).cable_credit_s(1e9, 9000) == pytest.approx(0.008)


def test_strategy_adds_the_cpu_part_on_a_cpu_lab(monkeypatch, tmp_path):
    """tworack8 on its CPU hosts: all 8 ranks share the (default) 2 cores; the plan states the
    network and the CPU part and the chunk it chose; the iteration includes the CPU part."""
    import yaml

    from topoctl.planner import make_plan
    from topoctl.spec.cluster_load import load_cluster
    from topoctl.spec.job import parse_job

    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))  # no calibration: the defaults
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text()) | {"strategies": ["trees"]}
    doc, _, evals = make_plan(load_cluster(PLANS / "tworack8-cluster.yaml"), parse_job(job),
                              use_cache=False)
    rt = doc["metadata"]["collective"]["runtime"]
    assert rt["cpu_costs"] == "default" and rt["ranks_per_core"] == 4.0
    assert rt["cpu_s"] > 0 and rt["network_s"] > 0
    sched = doc["job"]["collective"]["schedule"]
    assert sched["chunk_bytes"] == rt["chunk_bytes"]
    assert sched["metadata"]["pipeline"]["chunks"] == rt["chunks"]
    # the iteration holds at least M / R of network and the CPU part (the two overlap; the
    # buckets' network parts overlap the backward pass)
    it = evals[0].result.iteration_time
    m = doc["metadata"]["model"]["parameters_bytes"]
    rate = doc["metadata"]["collective"]["rate_bytes_per_s"] * (9000 - 52) / (9000 + 38)
    assert rt["network_s"] > m / rate
    assert it >= max(rt["cpu_s"], m / rate)
    assert 0.0 <= rt["exposed_cpu_s"] <= rt["cpu_s"]
    # topoctl explain shows both parts and the pipeline
    from topoctl.render.explain import explain_text

    text = explain_text(doc)
    assert "network part" in text and "CPU part" in text
    assert f"{rt['chunks']} chunks per tree of up to {rt['chunk_bytes']} bytes" in text


def test_network_and_cpu_parts_overlap():
    """The AllReduce takes the larger of its network and CPU parts (receives posted ahead
    overlap the CPU work with the transfers); only the excess CPU is exposed."""
    sh = tree_shape([[None, 0, 0, 1]], [1.0])
    slow = predict(sh, 8e6, 1e6, 16, RuntimeCosts(), 1)  # 1 MB/s: network-bound
    assert slow.network_s > slow.cpu_s > 0
    assert slow.seconds == slow.network_s and slow.exposed_cpu_s == 0.0
    fast = predict(sh, 8e6, 1e12, 16, RuntimeCosts(), 8)  # 1 TB/s: CPU-bound
    assert fast.cpu_s > fast.network_s
    assert fast.seconds == fast.cpu_s
    assert fast.exposed_cpu_s == pytest.approx(fast.cpu_s - fast.network_s)


def _up_height_depth(parents):
    """(subtree height, depth) of every rank, independently of the model (networkx)."""
    import networkx as nx

    g = nx.DiGraph((p, c) for c, p in enumerate(parents) if p is not None)
    g.add_nodes_from(range(len(parents)))
    root = parents.index(None)
    depth = nx.single_source_shortest_path_length(g, root)
    up = [max(nx.single_source_shortest_path_length(g, r).values()) for r in range(len(parents))]
    return up, [depth[r] for r in range(len(parents))]


def _program_loads(s: TreeSchedule, chunks: int, cap: dict, nbytes: float
                   ) -> tuple[dict, dict]:
    """From the program's rule (reduce r -> parent at step k + up(r), broadcast parent -> r at
    k + h + depth(parent)): seconds each link is busy in each step ({step: {link: s}}) and each
    link's share of the trees' rate."""
    sh = shape_of(s)
    busy: dict = {}
    share: dict = {}
    for t, frac in zip(s.trees, sh.fractions, strict=True):
        up, depth = _up_height_depth(t.parents)
        h = up[t.root]
        chunk = nbytes * frac / chunks
        for c, par in enumerate(t.parents):
            if par is None:
                continue
            for (a, b), first in (((c, par), up[c]), ((par, c), h + depth[par])):
                share[(a, b)] = share.get((a, b), 0.0) + frac
                for k in range(chunks):
                    per = busy.setdefault(first + k, {})
                    per[(a, b)] = per.get((a, b), 0.0) + chunk / cap[(a, b)]
    return busy, share


@pytest.mark.parametrize("world,ntrees,chunks", [(3, 1, 2), (5, 3, 1), (5, 3, 4), (8, 16, 3),
                                                 (8, 16, 40), (7, 8, 30)])
def test_fill_and_drain_steps_last_as_long_as_their_busiest_link(world, ntrees, chunks):
    """The network part with `links`, step by step from the program's rule (reduce r -> parent
    at step k + up(r), broadcast parent -> r at k + h + depth(parent)): every step as long as
    the link whose messages of that step take longest (bytes / capacity), summed; without
    `links` every step is a full one (longer whenever some step is not full)."""
    s = random_schedule(world, ntrees, seed=3 * world + ntrees)
    rng = random.Random(chunks)
    cap = {(a, b): rng.choice([1e6, 2e6, 5e6]) for a in range(world) for b in range(world)
           if a != b}
    nbytes = 8e6
    sh = shape_of(s)
    busy, share = _program_loads(s, chunks, cap, nbytes)
    direct = sum(max(per.values()) for per in busy.values())
    rate = min(cap[e] / x for e, x in share.items())  # the busiest link full in a full step
    uses = {e: [(e, 1.0 / cap[e])] for e in cap}
    got = predict(sh, nbytes, rate, chunks, FREE, 1, links=link_steps(sh, uses))
    assert got.network_s == pytest.approx(direct, rel=1e-9)
    full = predict(sh, nbytes, rate, chunks, FREE, 1)
    assert full.network_s == pytest.approx(got.steps * nbytes / (rate * chunks))
    assert full.network_s >= got.network_s * (1 - 1e-9)


@pytest.mark.parametrize("world,ntrees,chunks,credit", [(3, 1, 2, 0.3), (5, 3, 1, 0.5),
                                                        (5, 3, 4, 0.1), (8, 16, 3, 0.02),
                                                        (8, 16, 40, 0.05), (7, 8, 30, 1.0)])
@pytest.mark.parametrize("per_link", [False, True])
def test_token_credit_is_spent_after_a_link_idled(world, ntrees, chunks, credit, per_link):
    """With `credit_s` (the lab's HTB burst), step by step from the program's rule: each link
    starts with `credit_s` seconds of credit, sends from it first, earns it back while idle
    within a step (up to `credit_s`), and a step lasts as long as its slowest link's work
    beyond its credit. Never longer than without credit. `per_link`: every link its own
    credit (an array in `link_rows` order), as the lab's slow cables have more."""
    s = random_schedule(world, ntrees, seed=5 * world + ntrees)
    rng = random.Random(chunks + 7)
    cap = {(a, b): rng.choice([1e6, 2e6, 5e6]) for a in range(world) for b in range(world)
           if a != b}
    nbytes = 8e6
    sh = shape_of(s)
    busy, share = _program_loads(s, chunks, cap, nbytes)
    own = {e: credit * (rng.choice([0.5, 1.0, 3.0]) if per_link else 1.0) for e in cap}
    tokens = dict(own)
    direct = 0.0
    for step in range(max(busy) + 1):
        need = busy.get(step, {})
        work = {e: max(0.0, need.get(e, 0.0) - tokens[e]) for e in cap}
        took = max(work.values())
        for e in cap:
            spent = min(tokens[e], need.get(e, 0.0))
            tokens[e] = min(own[e], tokens[e] - spent + took - work[e])
        direct += took
    rate = min(cap[e] / x for e, x in share.items())
    uses = {e: [(e, 1.0 / cap[e])] for e in cap}
    links = link_steps(sh, uses)
    rows = link_rows(sh, uses)
    assert len(rows) == links.shape[0] and set(rows) <= set(cap)
    given = np.array([own[e] for e in rows]) if per_link else credit
    got = predict(sh, nbytes, rate, chunks, FREE, 1, links=links, credit_s=given)
    assert got.network_s == pytest.approx(direct, rel=1e-9, abs=1e-12)
    without = predict(sh, nbytes, rate, chunks, FREE, 1, links=links)
    assert got.network_s <= without.network_s * (1 + 1e-12)
    assert predict(sh, nbytes, rate, chunks, FREE, 1, links=links, credit_s=0.0).network_s == \
        without.network_s


def test_ranks_leave_the_lock_step_program_after_their_last_message():
    """A path 0 - 1 - 2 rooted at 0 (height 2, S = C + 3 steps): the root sends its last
    broadcast at step C + 1, the middle rank and the leaf are busy to the last step."""
    shape = tree_shape([[None, 0, 1]], [1.0])
    assert leave_fractions(shape, 4) == pytest.approx((6 / 7, 1.0, 1.0))
    # two trees rooted at either end: each end is a root once and a leaf once
    both = tree_shape([[None, 0, 1], [1, 2, None]], [1.0, 1.0])
    assert leave_fractions(both, 4) == pytest.approx((1.0, 1.0, 1.0))
    # any trees: the deepest leaf of the tallest tree takes every step, nobody leaves before
    # sending its last reduce chunk
    for seed in range(5):
        sched = random_schedule(7, 3, seed)
        shape = tree_shape([t.parents for t in sched.trees], [t.rate for t in sched.trees])
        got = leave_fractions(shape, 10)
        total = 10 + max(2 * h - 1 for h in shape.heights)
        assert max(got) == 1.0 and min(got) >= 10 / total
