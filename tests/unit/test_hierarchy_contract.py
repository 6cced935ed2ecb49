"""The hierarchical AllReduce's contract (`topocontract.hierarchy`): the plan's
`job.collective.hierarchical` parsed against the job's processes, its refusals naming the YAML
path, the ring-order test and the relabelling of a schedule over hosts. Pure, no torch."""

from __future__ import annotations

import pytest

from topocontract.hierarchy import (
    HierarchyError,
    parse_hierarchy,
    relabel_schedule,
    ring_is_sorted,
)
from topocontract.schedule import TreeSchedule


def procs(hosts: int, k: int, strided: bool = False) -> dict:
    return {f"h{j}": [{"rank": (j + i * hosts) if strided else j * k + i, "local_rank": i}
                      for i in range(k)] for j in range(hosts)}


def test_no_key_no_hierarchy():
    assert parse_hierarchy({"algorithm": "ring"}, procs(2, 2)) is None


def test_groups_follow_the_order_and_local_ranks():
    h = parse_hierarchy({"algorithm": "ring", "order": ["h2", "h0", "h1"],
                         "hierarchical": {"local_size": 2}}, procs(3, 2, strided=True))
    assert h.hosts == ("h2", "h0", "h1") and h.world_size == 6
    assert h.host_ranks(0) == (2, 5)  # h2: ranks 2 and 2+3
    assert h.shard_ranks(0) == (2, 0, 1) and h.shard_ranks(1) == (5, 3, 4)
    assert h.locate(4) == (2, 1)


@pytest.mark.parametrize("coll,processes,path", [
    ({"hierarchical": {"local_size": 0}}, procs(2, 2), "job.collective.hierarchical.local_size"),
    ({"hierarchical": {}}, procs(2, 2), "job.collective.hierarchical.local_size"),
    ({"algorithm": "pipeline", "hierarchical": {"local_size": 2}}, procs(2, 2),
     "job.collective.algorithm"),
    ({"order": ["h0"], "hierarchical": {"local_size": 2}}, procs(2, 2), "job.collective.order"),
    ({"order": ["h0", "h0"], "hierarchical": {"local_size": 2}}, procs(2, 2),
     "job.collective.order"),
    ({"hierarchical": {"local_size": 3}}, procs(2, 2), "job.processes.h0"),
    ({"hierarchical": {"local_size": 2}},
     {"h0": [{"rank": 0, "local_rank": 0}, {"rank": 5, "local_rank": 1}],
      "h1": [{"rank": 2, "local_rank": 0}, {"rank": 3, "local_rank": 1}]}, "job.processes"),
])
def test_refusals_name_the_yaml_path(coll, processes, path):
    with pytest.raises(HierarchyError) as e:
        parse_hierarchy(coll, processes)
    assert e.value.problems[0][0] == path


@pytest.mark.parametrize("local_size", [2**62, 2**70])
def test_a_huge_local_size_is_refused_without_a_range_of_it(local_size):
    """`hierarchical.local_size` is the plan's word: 2**62 (MemoryError) or 2**70
    (OverflowError) made the local-rank check build `list(range(local_size))`; now it compares
    the count first and refuses naming the host, in O(ranks)."""
    with pytest.raises(HierarchyError) as e:
        parse_hierarchy({"hierarchical": {"local_size": local_size}}, procs(2, 2))
    assert e.value.problems[0][0] == "job.processes.h0"
    assert f"local_size {local_size} needs exactly 0..{local_size - 1}" in \
        e.value.problems[0][1]


@pytest.mark.parametrize("order,same", [
    ([0, 1, 2, 3], True), ([2, 3, 0, 1], True), ([3, 2, 1, 0], True), ([1, 0, 3, 2], True),
    ([0, 2, 1, 3], False), ([0, 1, 3, 2], False), ([2, 0, 1], True), ([5], True),
])
def test_ring_is_sorted(order, same):
    assert ring_is_sorted(order) is same


def test_relabel_schedule_renames_every_rank():
    s = TreeSchedule.model_validate({"world_size": 3, "trees": [
        {"root": 0, "rate": 1.0, "parents": [None, 0, 1]},
        {"root": 2, "rate": 2.0, "parents": [2, 2, None]}]})
    r = relabel_schedule(s, [2, 0, 1])  # old rank 0 is now 2, 1 -> 0, 2 -> 1
    assert r.trees[0].root == 2 and r.trees[0].parents == [2, 0, None]
    assert r.trees[1].root == 1 and r.trees[1].parents == [1, None, 1]
    assert r.fractions == s.fractions
    with pytest.raises(HierarchyError):
        relabel_schedule(s, [0, 0, 1])
