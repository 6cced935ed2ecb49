"""MSCCL programs of the planned collectives: XML round trip, the executor's limits, and the
bytes each program puts on every link against the simulator's schedule of the same collective.
(That the programs compute the AllReduce is tests/integration/test_msccl_executor.py.)"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests import treegen
from topocontract.msccl import Limits, MscclError, check, from_xml, link_chunks, to_xml
from topocontract.schedule import TreeSchedule
from topoctl.collective.trees.simulate import tree_allreduce_schedule
from topoctl.msccl.ring import ring_allreduce
from topoctl.msccl.trees import tree_chunks, trees_allreduce
from topoctl.sim.schedules import ring_allreduce as sim_ring


def sim_link_bytes(schedule) -> dict[tuple[int, int], float]:
    out: dict[tuple[int, int], float] = {}
    for st in schedule.steps:
        key = (int(st.src), int(st.dst))
        out[key] = out.get(key, 0.0) + st.size * schedule.scale
    return out


def random_trees(world: int, ntrees: int, seed: int) -> list[tuple[list[int | None], float]]:
    return [(t["parents"], t["rate"]) for t in treegen.random_trees(world, ntrees, seed)]


@pytest.mark.parametrize("n", [2, 3, 8, 12])
def test_ring_program_moves_the_simulated_bytes(n):
    order = list(range(n))
    random.Random(n).shuffle(order)
    # the simulator's ring sends to the predecessor in the plan's order (gloo's direction)
    prog = ring_allreduce(list(reversed(order)))
    assert check(prog) == []
    assert all(len(tb.steps) == 2 * n - 1 for g in prog.gpus for tb in g.tbs)
    size = float(n * 1000)
    chunk = size / prog.nchunksperloop
    got = {k: v * chunk for k, v in link_chunks(prog).items()}
    assert got == pytest.approx(sim_link_bytes(sim_ring([str(r) for r in order], size)))


@pytest.mark.parametrize("world,ntrees,nchunks", [(4, 1, 8), (6, 3, 24), (8, 9, 64)])
def test_trees_program_moves_the_simulated_bytes(world, ntrees, nchunks):
    trees = random_trees(world, ntrees, seed=world + ntrees)
    prog = trees_allreduce(trees, nchunks)
    assert check(prog) == []
    counts = tree_chunks([r for _, r in trees], nchunks)
    kept = [(p, c) for (p, _), c in zip(trees, counts, strict=True) if c > 0]
    assert prog.nchannels == len(kept)
    # the same schedule, its rates the program's whole chunks
    sched = TreeSchedule.model_validate({"world_size": world, "trees": [
        {"root": p.index(None), "rate": float(c), "parents": p} for p, c in kept]})
    sim = tree_allreduce_schedule([str(r) for r in range(world)], float(nchunks), sched)
    assert {k: float(v) for k, v in link_chunks(prog).items()} == pytest.approx(
        sim_link_bytes(sim))


def test_xml_round_trip_is_exact_and_deterministic():
    prog = trees_allreduce(random_trees(5, 3, 1), 16)
    text = to_xml(prog)
    assert to_xml(from_xml(text)) == text
    assert to_xml(trees_allreduce(random_trees(5, 3, 1), 16)) == text
    assert text.startswith('<algo name="trees" proto="Simple" nchannels="3"')


def test_limits_are_named_with_the_way_out():
    long_ring = ring_allreduce(list(range(40)))  # 79 steps per thread block
    problems = check(long_ring)
    assert any("79 steps" in p and "MSCCL_MAX_NUM_STEPS" in p for p in problems)
    assert check(long_ring, Limits(max_steps=256)) == []
    many = trees_allreduce([(p, 1.0) for p, _ in random_trees(4, 33, 2)], 33)
    assert any("33 channels" in p and "MAXCHANNELS" in p for p in check(many))


def test_malformed_programs_are_refused_with_the_place():
    prog = ring_allreduce([0, 1, 2])
    tb = prog.gpus[1].tbs[0]
    tb.steps[0] = replace(tb.steps[0], cnt=72)
    tb.steps[1] = replace(tb.steps[1], depid=5, deps=0)
    prog.gpus[2].tbs[0].steps.pop()  # rank 2 no longer receives its last chunk
    problems = check(prog)
    assert any(p.startswith("gpu 1 tb 0 step 0: cnt 72") for p in problems)
    assert any(p.startswith("gpu 1 tb 0 step 1: waits for tb 5 step 0") for p in problems)
    assert any(p.startswith("rank 1 -> rank 2 on channel 0") for p in problems)
    with pytest.raises(MscclError, match="not well-formed"):
        from_xml("<algo")
    with pytest.raises(MscclError, match="attribute 'cnt' missing"):
        from_xml(to_xml(ring_allreduce([0, 1])).replace(' cnt="1"', "", 1))
