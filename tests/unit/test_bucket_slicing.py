"""The sliced-bucket contract (`topocontract.slicing`, ``job.collective.bucket_slicing``):
valid plans parse to a typed `Slicing`, every malformed field is named by its YAML path (here
and through the launch spec), plans without it stay as they were, and slices become element
counts only when they are whole elements summing to the bucket."""

from __future__ import annotations

import copy

import pytest

from topoagent.state.host import StateError
from topoagent.state.wire import parse_launch_spec
from topocontract.buckets import BucketPlanError
from topocontract.slicing import Slicing, slice_counts, slicing_of, slicing_problems

AT = "job.collective.bucket_slicing"
PLAN = [{"params": ["c", "b"], "bytes": 4000}, {"params": ["a"], "bytes": 40}]


def _coll(**slicing) -> dict:
    return {"algorithm": "ring", "bucket_plan": copy.deepcopy(PLAN), "bucket_slicing": slicing}


def test_a_valid_slicing_parses_and_round_trips():
    s = slicing_of(_coll(slice_bytes=1024, priority=[1, 0], credit=2048))
    assert s == Slicing((1, 0), 2048, slice_bytes=1024)
    assert s.rank() == {1: 0, 0: 1}
    assert slicing_of(_coll(**s.to_dict())) == s
    e = slicing_of(_coll(slices=[[2000, 2000], [40]], credit=1))
    assert e.slices == ((2000, 2000), (40,)) and e.priority == (0, 1)  # default: list order
    assert slicing_of(_coll(**e.to_dict())) == e


def test_a_plan_without_slicing_is_unchanged():
    c = {"algorithm": "ring", "bucket_plan": copy.deepcopy(PLAN)}
    assert slicing_of(c) is None and slicing_problems(c) == [] and c["bucket_plan"] == PLAN


@pytest.mark.parametrize("slicing, path, words", [
    ({"priority": [0, 1], "credit": 8}, AT, "exactly one of slice_bytes"),
    ({"slice_bytes": 8, "slices": [[4000], [40]], "credit": 8}, AT, "exactly one"),
    ({"slice_bytes": 0, "credit": 8}, f"{AT}.slice_bytes", "byte count > 0"),
    ({"slice_bytes": True, "credit": 8}, f"{AT}.slice_bytes", "byte count > 0"),
    ({"slices": [[4000]], "credit": 8}, f"{AT}.slices", "one list of slice sizes per bucket"),
    ({"slices": [[3000], [40]], "credit": 8}, f"{AT}.slices[0]", "sum to 3000 bytes"),
    ({"slices": [[4000], []], "credit": 8}, f"{AT}.slices[1]", "non-empty list"),
    ({"slice_bytes": 8, "priority": [0, 0], "credit": 8}, f"{AT}.priority", "exactly once"),
    ({"slice_bytes": 8, "priority": "first", "credit": 8}, f"{AT}.priority", "bucket indices"),
    ({"slice_bytes": 8}, f"{AT}.credit", "bytes in flight"),
    ({"slice_bytes": 8, "credit": -1}, f"{AT}.credit", "bytes in flight"),
    ({"slice_bytes": 8, "credit": 8, "window": 2}, f"{AT}.window", "unknown key"),
])
def test_every_malformed_field_is_named(slicing, path, words):
    problems = slicing_problems(_coll(**slicing))
    assert any(p == path and words in m for p, m in problems), problems
    with pytest.raises(BucketPlanError, match=words):
        slicing_of(_coll(**slicing))


def test_slicing_needs_a_bucket_plan_and_a_mapping():
    assert slicing_problems({"bucket_slicing": {"slice_bytes": 8, "credit": 8}}) == [
        (AT, "needs a bucket_plan: the plan's own buckets are sliced")]
    assert slicing_problems({"bucket_plan": PLAN, "bucket_slicing": [8]})[0][0] == AT


def test_the_launch_spec_checks_the_slicing():
    job = {"name": "j", "command": ["x"], "world_size": 1,
           "master": {"address": "127.0.0.1", "port": 1}, "batch": {"global": 1, "per_rank": 1},
           "model": {"factory": "m:f"}, "processes": {"h": [{"rank": 0, "local_rank": 0}]},
           "collective": _coll(slice_bytes=8, priority=[0, 2], credit=8)}
    with pytest.raises(StateError) as e:
        parse_launch_spec(job)
    assert e.value.problems[0][0] == f"{AT}.priority"


def test_slice_counts_are_whole_elements():
    s = slicing_of(_coll(slice_bytes=1030, credit=8))
    assert slice_counts(s, 0, 1000, 4) == [257, 257, 257, 229]  # 1030 B -> 257 elements
    assert slice_counts(slicing_of(_coll(slice_bytes=1, credit=8)), 1, 3, 4) == [1, 1, 1]
    e = slicing_of(_coll(slices=[[2000, 2000], [40]], credit=8))
    assert slice_counts(e, 0, 1000, 4) == [500, 500]
    with pytest.raises(BucketPlanError, match=r"slices\[0\]: expected whole 4-byte"):
        slice_counts(e, 0, 999, 4)  # the model's bucket is not the plan's
    with pytest.raises(BucketPlanError, match="whole 8-byte"):
        slice_counts(slicing_of(_coll(slices=[[2002, 1998], [40]], credit=8)), 0, 500, 8)
