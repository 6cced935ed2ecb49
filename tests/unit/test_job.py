"""job.yaml: parsing, defaults and errors that name the YAML path."""

from __future__ import annotations

import pytest

from topoctl.spec.job import JobError, load_job, parse_job, parse_size

BASE = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "j",
        "model": {"catalog": "mlp", "params": {"layers": 2}}, "batch": {"global": 64}}


def errors(data: dict) -> dict[str, str]:
    with pytest.raises(JobError) as e:
        parse_job(data)
    return dict(e.value.problems)


def test_minimal_job_gets_defaults():
    j = parse_job(BASE)
    assert j.batch.global_ == 64
    assert j.strategies == ["baseline"] and j.sync.algorithm == "ring"
    assert j.sync.bucket == 25 * 10**6 and j.cost.method == "auto"
    assert j.to_dict()["batch"] == {"global": 64}
    assert (j.bandwidth.objective, j.bandwidth.multipath) == ("minmax", False)  # opt-in


def test_bad_bandwidth_section_names_file_and_path(tmp_path):
    import yaml

    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(BASE | {"bandwidth": {"objective": "proportional",
                                                      "multipath": True}}))
    with pytest.raises(JobError) as e:
        load_job(f)
    assert e.value.source == str(f)
    assert [p for p, _ in e.value.problems] == ["bandwidth.multipath"]


@pytest.mark.parametrize("text,size", [("25MB", 25 * 10**6), ("4MiB", 4 * 2**20),
                                       (1000, 1000), ("1.5kb", 1500)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("patch,path,needle", [
    ({"model": {"catalog": "resnot"}}, "model.catalog", "unknown model"),
    ({"model": {"catalog": "bert", "params": {"layer": 2}}}, "model.params.layer",
     "unknown parameter"),
    ({"model": {"catalog": "bert", "params": {"layers": 0}}}, "model.params.layers",
     "positive integer"),
    ({"model": {"factory": "nocolon"}}, "model.factory", "pkg.module:callable"),
    ({"model": {"factory": "a.b:c"}}, "model.inputs", "input shapes"),
    ({"model": {}}, "model", "exactly one"),
    ({"batch": {"global": 0}}, "batch.global", "greater than or equal"),
    ({"sync": {"bucket": "lots"}}, "sync.bucket", "not a size"),
    ({"colour": "red"}, "colour", "unknown key"),
    ({"strategies": ["baseline", "baseline"]}, "strategies", "twice"),
    ({"parallelism": {"data": False}}, "parallelism", "at least one"),
    ({"cost": {"method": "guess"}}, "cost.method", "auto"),
    ({"bandwidth": {"objective": "fastest"}}, "bandwidth.objective", "minmax"),
    ({"bandwidth": {"multipath": "yes"}}, "bandwidth.multipath", "boolean"),
    ({"bandwidth": {"objective": "proportional", "multipath": True}}, "bandwidth.multipath",
     "only with objective: minmax"),
    ({"bandwidth": {"weights": 3}}, "bandwidth.weights", "unknown key"),
])
def test_errors_name_the_path(patch, path, needle):
    probs = errors(BASE | patch)
    assert path in probs, probs
    assert needle in probs[path]


def test_load_job_reports_file_problems(tmp_path):
    with pytest.raises(JobError, match="No such file"):
        load_job(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(JobError, match="malformed YAML at line"):
        load_job(bad)
    bad.write_text("- a list\n")
    with pytest.raises(JobError, match="expected a mapping"):
        load_job(bad)


def test_example_jobs_parse():
    from pathlib import Path

    files = sorted(Path(__file__).parents[2].joinpath("plans").glob("*job*.yaml"))
    assert len(files) >= 5
    for f in files:
        load_job(f)
