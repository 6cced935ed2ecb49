"""The bucket-plan contract (`topocontract.buckets`): shape and coverage problems name the
YAML path; a plan's `job` with a malformed bucket plan is refused by the launch spec."""

from __future__ import annotations

import pytest

from topoagent.state.host import StateError
from topoagent.state.wire import parse_launch_spec
from topocontract.buckets import (
    BucketPlanError,
    bucket_overlap_of,
    bucket_plan_of,
    overlap_problems,
    shape_problems,
)

AT = "job.collective.bucket_plan"


def test_a_valid_plan_gives_its_buckets_in_order():
    c = {"bucket_plan": [{"params": ["b", "a"], "bytes": 8}, {"params": ["c"]}]}
    assert bucket_plan_of(c, ["a", "b", "c"]) == [["b", "a"], ["c"]]
    assert bucket_plan_of({"algorithm": "ring"}) is None


@pytest.mark.parametrize("plan, path, words", [
    ([], AT, "non-empty list"),
    ([{"params": []}], f"{AT}[0].params", "non-empty list"),
    ([{"params": ["a"], "cap": 1}], f"{AT}[0].cap", "unknown key"),
    ([{"params": ["a"], "bytes": -1}], f"{AT}[0].bytes", "byte count"),
    ([{"params": ["a"]}, {"params": ["b", "a"]}], f"{AT}[1].params[1]", "already in"),
    (["a"], f"{AT}[0]", "expected a mapping"),
])
def test_shape_problems_name_the_yaml_path(plan, path, words):
    problems = shape_problems(plan)
    assert any(p == path and words in m for p, m in problems), problems


def test_coverage_against_the_model():
    c = {"bucket_plan": [{"params": ["a", "z"]}]}
    with pytest.raises(BucketPlanError) as e:
        bucket_plan_of(c, ["a", "b"])
    assert (f"{AT}[0].params[1]", "the model has no trainable parameter z") in e.value.problems
    assert any(p == AT and "b" in m for p, m in e.value.problems)


def test_the_launch_spec_checks_the_shape():
    job = {"name": "j", "command": ["x"], "world_size": 1,
           "master": {"address": "127.0.0.1", "port": 1}, "batch": {"global": 1, "per_rank": 1},
           "model": {"factory": "m:f"}, "processes": {"h": [{"rank": 0, "local_rank": 0}]},
           "collective": {"algorithm": "ring", "bucket_plan": [{"params": "a"}]}}
    with pytest.raises(StateError) as e:
        parse_launch_spec(job)
    assert e.value.problems[0][0] == f"{AT}[0].params"


def test_bucket_overlap_is_a_known_mode_next_to_a_bucket_plan():
    plan = [{"params": ["a"]}]
    assert bucket_overlap_of({"bucket_plan": plan}) == "backward"
    assert bucket_overlap_of({"bucket_plan": plan, "bucket_overlap": "forward"}) == "forward"
    with pytest.raises(BucketPlanError, match=r"job.collective.bucket_overlap: expected one"):
        bucket_overlap_of({"bucket_plan": plan, "bucket_overlap": "sideways"})
    assert overlap_problems({"bucket_overlap": "forward"})[0][1].startswith("needs a bucket_plan")
