"""The sliced, priority-scheduled bucket timeline (`topoctl.disco.priority`) over plain data:
slicing, the credit's overlap of start-ups, a later-ready higher-priority bucket overtaking
queued slices (and not in the old static order), the forward waiting only for the buckets it
reads, the bound, ByteScheduler's defaults and the counted grid."""

from __future__ import annotations

import pytest

from topoctl.disco.priority import (
    bytescheduler_default,
    cut,
    search_slicing,
    sliced_iteration,
)

A, B = 1e-3, 1e-6  # 1 ms per AllReduce, 1 us per byte


def test_cut_whole_elements_last_slice_the_rest():
    assert cut(10, 4) == [4, 4, 2]
    assert cut(10, 6) == [4, 4, 2]  # rounded down to whole 4-byte elements
    assert cut(8, 100) == [8]
    assert cut(6, 1, element=2) == [2, 2, 2]


def test_one_slice_is_the_linear_model():
    t = sliced_iteration([0.002], [0.0], [[1000]], [0], 1, A, B, fwd=0.01, bwd=0.002,
                         overlap="backward")
    assert t.iteration == pytest.approx(0.01 + 0.002 + A + 1000 * B)
    assert t.sent == ((0, 0),)


def test_a_credit_overlaps_the_start_ups():
    slices = [[1000] * 4]
    one = sliced_iteration([0.0], [0.0], slices, [0], 1000, A, B, 0.0, 0.0, overlap="backward")
    four = sliced_iteration([0.0], [0.0], slices, [0], 4000, A, B, 0.0, 0.0, overlap="backward")
    assert one.done[0] == pytest.approx(4 * (A + 1000 * B))
    assert four.done[0] == pytest.approx(A + 4000 * B)


def test_a_later_ready_higher_priority_bucket_overtakes_queued_slices():
    # bucket 0 (last layer, ready first) has 5 slices; bucket 1 (first layer) is ready
    # during the first slice and has the higher priority: it goes second
    ready, slices = [0.0, 0.0015], [[1000] * 5, [1000]]
    t = sliced_iteration(ready, [0.004, 0.0], slices, [1, 0], 1000, A, B, 0.01, 0.0015)
    assert t.sent == ((0, 0), (1, 0), (0, 1), (0, 2), (0, 3), (0, 4))
    assert t.done[1] == pytest.approx(4e-3)
    # the old runtime's static order holds bucket 0 back until bucket 1 is sent
    old = sliced_iteration(ready, [0.004, 0.0], slices, [1, 0], 1000, A, B, 0.01, 0.0015,
                           in_order=True)
    assert old.sent[0] == (1, 0)
    fifo = sliced_iteration(ready, [0.004, 0.0], slices, [0, 1], 1000, A, B, 0.01, 0.0015)
    assert fifo.sent[-1] == (1, 0)
    # the next forward reads bucket 1 first: priority shortens the iteration
    assert t.iteration < fifo.iteration and t.iteration < old.iteration


def test_the_forward_waits_only_for_the_buckets_it_reads():
    # bucket 0 is read at the end of the forward: its AllReduce hides under the forward
    t = sliced_iteration([0.0, 0.0], [0.009, 0.0], [[4000], [1000]], [1, 0], 10**9, A, B,
                         fwd=0.01, bwd=0.001)
    assert t.done[1] == pytest.approx(A + 1000 * B)
    assert t.iteration == pytest.approx(t.done[1] + 0.01)
    assert t.done[0] < t.done[1] + 0.009  # done before the forward reaches it


@pytest.mark.parametrize("seed", range(6))
def test_never_below_the_bound(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(1, 6)
    sizes = [rng.randint(1, 50) * 400 for _ in range(n)]
    ready = sorted(rng.uniform(0, 0.01) for _ in range(n))
    need = [rng.uniform(0, 0.01) for _ in range(n)]
    for overlap in ("backward", "forward"):
        for credit in (1, 4000, 10**9):
            t = sliced_iteration(ready, need, [cut(s, 2000) for s in sizes],
                                 rng.sample(range(n), n), credit, A, B, 0.01, 0.01, 0.001,
                                 overlap)
            assert t.iteration >= max(0.021, A + B * sum(sizes)) - 1e-12
            assert sorted(t.sent) == sorted((k, i) for k, s in enumerate(sizes)
                                            for i in range(len(cut(s, 2000))))


def test_bytescheduler_default_and_the_counted_grid():
    sizes = [9_000_000, 400, 2_000_000]  # buckets in ready order: the last layer first
    need = [0.008, 0.004, 0.0]
    d = bytescheduler_default(sizes, need)
    assert d["slice_bytes"] == 4_000_000 and d["credit"] == 16_000_000
    assert d["slices"] == [[4_000_000, 4_000_000, 1_000_000], [400], [2_000_000]]
    assert d["priority"] == [2, 1, 0]
    args = ([0.0, 0.002, 0.004], need, sizes, A, 1e-9, 0.01, 0.004)
    s = search_slicing(*args)
    assert s == search_slicing(*args)  # deterministic
    assert s.evaluations == len(s.grid) == 7 * 4 + 1
    bs = sliced_iteration(args[0], need, d["slices"], d["priority"], d["credit"], A, 1e-9,
                          0.01, 0.004).iteration
    assert s.iteration <= bs and (4_000_000, 16_000_000, bs) in s.grid
