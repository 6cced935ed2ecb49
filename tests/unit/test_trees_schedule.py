"""The tree schedule file (topocontract.schedule): validation with clear errors."""

from __future__ import annotations

import json

import pytest
import yaml

from topotrain.collectives import (
    ScheduleError,
    ScheduleMismatch,
    TreeSchedule,
    check_world_size,
    load_schedule,
    partition_sizes,
)

GOOD = {"apiVersion": "topoctl/v1", "kind": "TreeSchedule", "world_size": 4, "chunk_bytes": 64,
        "trees": [{"root": 0, "rate": 2.0, "parents": [None, 0, 1, 1]},
                  {"root": 3, "rate": 1.0, "parents": [3, 0, 3, None]}]}


def bad(**tree) -> dict:
    return {**GOOD, "trees": [{**GOOD["trees"][0], **tree}]}


def test_roundtrip_yaml_and_json(tmp_path):
    y, j = tmp_path / "s.yaml", tmp_path / "s.json"
    y.write_text(yaml.safe_dump(GOOD))
    j.write_text(json.dumps(GOOD))
    a, b = load_schedule(y), load_schedule(j)
    assert a == b and a.dump()["trees"] == GOOD["trees"]
    assert a.fractions == pytest.approx([2 / 3, 1 / 3])
    assert [t.height() for t in a.trees] == [2, 2]
    assert a.trees[0].children(1) == [2, 3]


@pytest.mark.parametrize(
    "data,message",
    [
        (bad(parents=[None, 0, 1]), "trees.0.*3 entries, world_size is 4"),
        (bad(parents=[None, 2, 1, 1]), "cycle"),
        (bad(parents=[None, None, 1, 1]), r"parents\[1\] is null but 1 is not the root"),
        (bad(parents=[1, 0, 1, 1]), r"parents\[0\] must be null"),
        (bad(parents=[None, 0, 7, 1]), r"parents\[2\] = 7 is not another rank"),
        (bad(root=9), "root 9 is not a rank"),
        (bad(rate=0), "rate"),
        (bad(rate=float("inf")), "finite"),
        ({**GOOD, "trees": []}, "trees"),
        ({**GOOD, "extra": 1}, "extra"),
    ],
)
def test_bad_schedules_are_refused(data, message):
    with pytest.raises(ScheduleError, match=message):
        load_schedule(data)


def test_unreadable_files(tmp_path):
    with pytest.raises(ScheduleError, match="cannot read"):
        load_schedule(tmp_path / "missing.yaml")
    p = tmp_path / "x.yaml"
    p.write_text("- just a list\n")
    with pytest.raises(ScheduleError, match="mapping"):
        load_schedule(p)


def test_world_size_mismatch_names_both_sizes():
    s = TreeSchedule.model_validate(GOOD)
    check_world_size(s, 4)
    with pytest.raises(ScheduleMismatch, match="world_size=4 but this job runs 5 ranks"):
        check_world_size(s, 5)


@pytest.mark.parametrize("numel", [0, 1, 2, 3, 7, 1000, 12345])
def test_partition_sizes_sum_and_proportion(numel):
    fr = [0.5, 0.3, 0.2]
    sizes = partition_sizes(numel, fr)
    assert sum(sizes) == numel
    assert all(abs(s - numel * f) < 1 for s, f in zip(sizes, fr, strict=True))
