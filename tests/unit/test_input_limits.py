"""Input limits of the one YAML loader (`topoagent.state.yamlload`, through
`topoagent.state.host.load_yaml_file`), the schema's kernel limits and the checked enums: every
refusal is a TopoError naming the file and the YAML path, in well under a second, before any
host or file is touched. Through the real CLIs where the audit found exit 70 or a hang."""

from __future__ import annotations

import io
import os
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from tests.fuzzgen import topoctl
from topoagent import cli as agent_cli
from topoagent.state.host import (
    MAX_BYTES,
    StateError,
    load_host_state,
    load_yaml,
    load_yaml_file,
    parse_host_state,
)
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import JobError, load_job, parse_job

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "plans"
JOB = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "j",
       "model": {"catalog": "mlp", "params": {"layers": 2}}, "batch": {"global": 64}}


def laughs(key: str, levels: int = 9, width: int = 10) -> str:
    """A document of about 430 bytes whose `key` stands for width**levels values."""
    lines = [f"x0: &a0 [{','.join(['1'] * width)}]"]
    lines += [f"x{i}: &a{i} [{','.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "defs:\n" + "".join(f"  {line}\n" for line in lines) + f"{key}: *a{levels - 1}\n"


def refused(text: str, source: str = "s.yaml") -> StateError:
    t0 = time.process_time()
    with pytest.raises(StateError) as e:
        load_host_state(text, source)
    assert time.process_time() - t0 < 2, "a refusal must be cheap"
    assert e.value.source == source
    return e.value


def test_nested_aliases_are_refused_before_anything_walks_them():
    text = laughs("routes")
    assert len(text) < 500
    e = refused(text)
    assert e.problems[0][0].startswith("routes") or e.problems[0][0].startswith("defs")
    assert "aliases counted as the values they stand for" in str(e)


@pytest.mark.parametrize("text", ["routes: &a [*a]\n", "sysctl: &a {rp_filter: *a}\n"])
def test_a_recursive_alias_is_refused(text):
    assert "recursive alias" in str(refused(text))


def test_aliases_beyond_the_cap_are_refused():
    text = "x: &a 1\nroutes: [" + ", ".join(["*a"] * 1001) + "]\n"
    e = refused(text)
    assert e.problems == [("routes[1000]", "more than 1000 aliases")]


def test_deep_nesting_is_refused():
    e = refused("routes: " + "[" * 200 + "]" * 200 + "\n")
    assert "nested deeper than 64 levels" in str(e)


def test_an_integer_of_thousands_of_digits_is_refused():
    e = refused("interfaces: [{name: lo, mtu: " + "9" * 5000 + "}]\n")
    assert e.problems == [("interfaces[0].mtu", "an integer of 5000 digits (at most 64)")]


@pytest.mark.parametrize(("value", "says"), [
    ("021450", "021450 is octal in YAML 1.1 (9000) and decimal in YAML 1.2"),
    ("2:30:00", "2:30:00 is a base-60 number in YAML 1.1 and text in YAML 1.2"),
    ("9_000", "9_000 is 9000 in YAML 1.1 and text in YAML 1.2"),
    ("0b10001100101000", "is binary in YAML 1.1"),
])
def test_yaml_1_1_numbers_are_refused(value, says):
    e = refused(f"interfaces: [{{name: lo, mtu: {value}}}]\n")
    assert e.problems[0][0] == "interfaces[0].mtu" and says in e.problems[0][1], e.problems


@pytest.mark.parametrize("word", ["yes", "No", "on", "OFF"])
def test_yaml_1_1_booleans_are_refused(word):
    e = refused(f"interfaces: [{{name: lo, up: {word}}}]\n")
    assert e.problems[0][0] == "interfaces[0].up"
    assert "a boolean in YAML 1.1 and text in YAML 1.2" in e.problems[0][1]


def test_yaml_1_2_numbers_and_quoted_text_still_load():
    s = load_host_state("interfaces: [{name: lo, mtu: 9000, up: true}]\n"
                        "routes: [{dst: 10.0.0.0/8, dev: lo, metric: 0x10, table: 100}]\n")
    assert s.interfaces[0].mtu == 9000 and s.routes[0].metric == 16
    assert load_yaml("a: '021450'\nb: 'yes'\n") == {"a": "021450", "b": "yes"}


def test_more_htb_classes_than_a_link_has_ids_are_refused():
    classes = [{"dst": f"10.{i // 256}.{i % 256}.0/24", "rate": 1000} for i in range(4095)]
    with pytest.raises(StateError) as e:
        parse_host_state({"qos": [{"dev": "lo", "rate": "10gbit", "classes": classes}]})
    assert e.value.problems[0][0] == "qos[0].classes" and "at most 4094" in str(e.value)


def test_a_class_for_all_traffic_is_refused_at_validation():
    e = refused("qos: [{dev: lo, rate: 1gbit, classes: [{dst: 0.0.0.0/0, rate: 1mbit}]}]\n")
    assert "classes[0].dst: 0.0.0.0/0 is all traffic" in str(e)


@pytest.mark.timeout(60)
def test_fifos_and_devices_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device"),
                       (tmp_path, "a directory")):
        with pytest.raises(StateError) as e:
            load_yaml_file(path)
        assert e.value.source == str(path) and kind in str(e.value), str(e.value)


def test_a_file_larger_than_the_cap_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: costs nothing to make
    with pytest.raises(StateError) as e:
        load_yaml_file(big)
    assert f"larger than {MAX_BYTES} bytes" in str(e.value)


class Zeros(io.RawIOBase):
    """/dev/zero as stdin, except that reading 4 caps' worth fails the test at once instead of
    growing until the machine runs out of memory (what the agent did: 3.7 GB)."""

    def __init__(self):
        self.given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        assert self.given <= 4 * MAX_BYTES, "read far past the byte cap"
        buf[:] = bytes(len(buf))
        self.given += len(buf)
        return len(buf)


def test_endless_stdin_is_refused_at_the_cap(monkeypatch, capsys):
    """`topo-agent diff - < /dev/zero`: refused after the cap, with about that much memory."""
    zeros = Zeros()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(zeros)))
    tracemalloc.start()
    try:
        rc = agent_cli.main(["diff", "-"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 1 and zeros.given <= 2 * MAX_BYTES
    assert f"<stdin>: larger than {MAX_BYTES} bytes" in capsys.readouterr().err
    assert peak < 4 * MAX_BYTES


@pytest.mark.timeout(120)  # a FIFO read would block forever
@pytest.mark.parametrize("verb", ["plan", "explain"])
def test_topoctl_refuses_alias_bombs_fifos_and_dev_zero(tmp_path, verb):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(laughs("hosts"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    job = str(PLANS / "mlp-job.yaml")
    topoctl(["explain", str(PLANS / "mlp-hetero8-plan.yaml")])  # imports, outside the clock
    for bad in (bomb, fifo, Path("/dev/zero")):
        argv = ["plan", str(bad), job] if verb == "plan" else ["explain", str(bad)]
        t0 = time.process_time()
        rc, out, err = topoctl(argv)
        assert rc == 1 and "Traceback" not in err, (argv, rc, err)
        assert f"topoctl: {bad}: " in err, err
        assert time.process_time() - t0 < 5


def test_cluster_and_job_files_go_through_the_same_limits(tmp_path):
    c = tmp_path / "c.yaml"
    c.write_text(laughs("hosts"))
    with pytest.raises(StateError) as e:
        load_cluster(c)
    assert e.value.source == str(c)
    j = tmp_path / "j.yaml"
    j.write_text(yaml.safe_dump(JOB).replace("global: 64", "global: 0100"))
    with pytest.raises(JobError) as e:
        load_job(j)
    assert e.value.problems[0][0] == "batch.global" and "octal" in e.value.problems[0][1]


def test_sync_algorithm_is_an_enum():
    with pytest.raises(JobError) as e:
        parse_job(JOB | {"sync": {"algorithm": "quantum"}})
    assert e.value.problems[0][0] == "sync.algorithm"
    assert "unknown algorithm 'quantum'" in e.value.problems[0][1]
    assert parse_job(JOB | {"sync": {"algorithm": "ring"}}).sync.algorithm == "ring"


@pytest.mark.parametrize(("change", "path"), [
    ({"hosts": []}, "hosts"),
    ({"launch": {"command": []}}, "launch.command"),
    ({"launch": {"command": [""]}}, "launch.command[0]"),
])
def test_empty_lists_the_planner_cannot_use_are_refused(change, path):
    with pytest.raises(JobError) as e:
        parse_job(JOB | change)
    assert e.value.problems[0][0] == path, e.value.problems
