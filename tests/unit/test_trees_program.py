"""The lock-step program compiler (topotrain.collectives.program), executed in one process.

Every rank's program is compiled separately; the messages are then delivered step by step
between their in-memory tensors exactly as the gloo executor would (a message's pieces in
wire order), so a wrong step, a piece order that differs between the two ends, or a read of
data that is not final yet shows up as a wrong sum or as unmatched messages."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.treegen import random_trees  # noqa: E402
from topocontract.trees import chunk_count  # noqa: E402
from topotrain.collectives import TreeSchedule, partition_sizes  # noqa: E402
from topotrain.collectives.program import compile_program  # noqa: E402


def random_schedule(world: int, ntrees: int, seed: int, chunk_bytes: int = 64) -> TreeSchedule:
    return TreeSchedule.model_validate({"world_size": world, "chunk_bytes": chunk_bytes,
                                        "trees": random_trees(world, ntrees, seed)})


def execute(schedule: TreeSchedule, inputs: list[torch.Tensor], chunks: int) -> list:
    """Run every rank's program in lock step over in-memory 'wires'."""
    world = schedule.world_size
    progs = [compile_program(schedule, inputs[0].numel(), r, chunks) for r in range(world)]
    flats = [x.clone() for x in inputs]
    # align the compacted step lists: steps are matched per pair in order, which is what
    # gloo does; deliver messages pair by pair in posting order
    queues: dict[tuple[int, int], list] = {}
    for r, p in enumerate(progs):
        for snd, _ in p.steps:
            for m in snd:
                queues.setdefault((r, m.peer), [])
    cursor = [0] * world
    progress = True
    while progress:
        progress = False
        for r, p in enumerate(progs):
            if cursor[r] >= len(p.steps):
                continue
            snd, rcv = p.steps[cursor[r]]
            # a step runs when every receive has its message queued; sends are enqueued first
            if not getattr(p, "_sent", None) == cursor[r]:
                for m in snd:
                    data = torch.cat([flats[r][o:o + n] for o, n, _ in m.pieces]).clone()
                    queues[(r, m.peer)].append((m.length, data))
                object.__setattr__(p, "_sent", cursor[r])
            if all(queues.get((m.peer, r)) for m in rcv):
                for m in rcv:
                    length, data = queues[(m.peer, r)].pop(0)
                    assert length == m.length, "message sizes differ at the two ends"
                    b = 0
                    for o, n, kind in m.pieces:
                        if kind == 0:
                            flats[r][o:o + n] += data[b:b + n]
                        else:
                            flats[r][o:o + n] = data[b:b + n]
                        b += n
                cursor[r] += 1
                progress = True
    assert all(cursor[r] == len(progs[r].steps) for r in range(world)), "deadlock"
    assert all(not q for q in queues.values()), "unreceived messages"
    return flats


@pytest.mark.parametrize("world,ntrees,numel,chunks", [
    (2, 1, 1, 1), (3, 4, 2, 3), (5, 3, 7, 16), (8, 9, 1000, 7), (7, 2, 4099, 40),
    (8, 16, 333, 5), (4, 1, 64, 64),
])
def test_program_sums_like_all_reduce(world, ntrees, numel, chunks):
    sched = random_schedule(world, ntrees, seed=world * 31 + ntrees)
    gen = torch.Generator().manual_seed(numel)
    inputs = [torch.randint(-1000, 1000, (numel,), generator=gen, dtype=torch.int64)
              for _ in range(world)]
    want = sum(inputs)
    for out in execute(sched, inputs, chunks):
        assert torch.equal(out, want)


def test_one_message_per_peer_per_step_and_step_count():
    sched = random_schedule(8, 16, seed=3)
    chunks = 12
    heights = [t.height() for t in sched.trees]
    for r in range(8):
        p = compile_program(sched, 100_000, r, chunks)
        for snd, rcv in p.steps:
            assert len({m.peer for m in snd}) == len(snd)
            assert len({m.peer for m in rcv}) == len(rcv)
        assert len(p.steps) <= chunks + 2 * max(heights) - 1
    # a tree of height h takes C + 2h - 1 steps: the root of a star sends in steps 1..C
    star = TreeSchedule.model_validate({"world_size": 3, "trees": [
        {"root": 0, "rate": 1.0, "parents": [None, 0, 0]}]})
    assert len(compile_program(star, 30, 0, 5).steps) == 5 + 2 - 1


def test_chunk_count_from_chunk_bytes():
    sched = random_schedule(4, 2, seed=1, chunk_bytes=1000)
    sizes = partition_sizes(10_000, sched.fractions)
    assert chunk_count(sched, 10_000, 4) == max(-(-s * 4 // 1000) for s in sizes)
    assert chunk_count(sched, 1, 4) == 1
    # the same input compiles to the same program
    assert compile_program(sched, 999, 2, 7) == compile_program(sched, 999, 2, 7)
