"""Property-based fuzzing of the topoctl verbs the planner fuzz does not reach: `trees` and its
old name `sync` (edge files and flags), `run` and `stop` (damaged plans, bad flags),
`topology`, `inventory` and `vagrant` (damaged cluster files, bad flags). The lab verbs, which
need root and a real lab, are fuzzed in tests/integration/test_fuzz_lab.py.

Every case asserts the invariant of tests/fuzzgen.py: exit 0 or 1, never 70, no traceback,
errors as `topoctl: FILE: yaml.path: message` naming the damaged file. The inputs that found
bugs are kept below as explicit regression cases."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzgen import assert_clean, fuzz_settings, mutated, topoctl

PLANS = Path(__file__).resolve().parents[2] / "plans"
PLAN = yaml.safe_load((PLANS / "mlp-hetero8-plan.yaml").read_text())
CLUSTER = yaml.safe_load((PLANS / "hetero8-cluster.yaml").read_text())
EXAMPLES = int(os.environ.get("TOPO_FUZZ_VERB_EXAMPLES", "300"))
NO_LAB = ["--lab", "tpxnosuch"]  # a lab that is never up: run/stop stop before any host

# tokens an edge file line is made of: names, numbers of every kind, junk
TOKENS = ["a", "b", "c", "s0", "1", "2.5", "0", "-1", "1e309", "nan", "inf", "1e-300", "0x10",
          "x", "#", "a:b", "é", "\t", "a" * 40, "100mbit"]
VALID_EDGES = "a b 1\nb c 2\nc a 1\nc s0 4\ns0 d 1\n"


def _file(d: Path, name: str, data: bytes) -> str:
    p = d / name
    p.write_bytes(data)
    return str(p)


@st.composite
def edge_files(draw) -> bytes:
    """A valid edge file with lines replaced, dropped or added, or random bytes."""
    kind = draw(st.sampled_from(["lines", "lines", "bytes", "valid"]))
    if kind == "bytes":
        return draw(st.binary(max_size=60))
    lines = VALID_EDGES.splitlines()
    if kind == "lines":
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(lines)))
            new = " ".join(draw(st.lists(st.sampled_from(TOKENS), max_size=5)))
            if i < len(lines) and draw(st.booleans()):
                lines[i] = new
            else:
                lines.insert(i, new)
    return "\n".join(lines).encode()


SYNC_FLAGS = st.lists(st.sampled_from([
    ["--workers", "a,b,c,d"], ["--workers", "a,a"], ["--workers", "zz,a"], ["--workers", ","],
    ["--workers", "s0,a"], ["--max-trees", "1"], ["--max-trees", "0"], ["--max-trees", "-3"],
    ["--max-trees", "x"], ["--chunk-bytes", "1"], ["--chunk-bytes", "0"],
    ["--chunk-bytes", "-5"], ["--chunk-bytes", "1e3"], ["--json"], ["-o", "{out}"],
    ["-o", "/nonexistent/dir/s.yaml"], ["-o", "{dir}"], ["--output", "{out}"],
    ["--schedule", "{out}"], ["--detailed-exitcode"], ["--bogus"]]), max_size=3)


@fuzz_settings(EXAMPLES)
@given(data=edge_files(), flags=SYNC_FLAGS, verb=st.sampled_from(["trees", "sync"]))
def test_trees_any_edge_file_and_flags(data, flags, verb):
    with tempfile.TemporaryDirectory() as tmp:
        _sync_case(Path(tmp), data, flags, verb)


def _sync_case(d: Path, data: bytes, flags: list[list[str]], verb: str = "trees") -> None:
    edges = _file(d, "edges.txt", data)
    argv = [verb, "--edges", edges] + [a.format(out=d / "s.yaml", dir=d)
                                       for f in flags for a in f]
    rc, out, err = topoctl(argv)
    assert_clean(argv, rc, err, out=out)


def _plan_flags() -> st.SearchStrategy:
    return st.lists(st.sampled_from([
        ["--iterations", "0"], ["--iterations", "-5"], ["--iterations", "x"],
        ["--iterations", "3"], ["--timeout", "nan"], ["--timeout", "-1"], ["--timeout", "inf"],
        ["--timeout", "5"], ["--hosts", "h0,nosuch"], ["--hosts", ","], ["--json"],
        ["--local"], ["--ssh"], ["--cluster", "{missing}"], ["--verbose"], ["--bogus"]]),
        max_size=3)


@fuzz_settings(EXAMPLES)
@given(doc=st.one_of(mutated(st.just(PLAN)), st.just(PLAN), junk_docs := st.one_of(
    st.binary(max_size=40), st.just(b""), st.just(b"\xff\xfe"))), verb=st.sampled_from(
    ["run", "stop"]), flags=_plan_flags())
def test_run_and_stop_any_plan_and_flags_stop_cleanly_before_any_host(doc, verb, flags):
    """A damaged plan (junk at any depth, random bytes), bad flags, hosts that do not exist:
    an error naming the file (or the flag), exit 1; with no lab up nothing is started."""
    with tempfile.TemporaryDirectory() as tmp:
        _plan_case(Path(tmp), doc, verb, flags)


def _plan_case(d: Path, doc, verb: str, flags: list[list[str]]) -> None:
    data = doc if isinstance(doc, bytes) else yaml.safe_dump(doc).encode()
    plan = _file(d, "plan.yaml", data)
    fl = [a.format(missing=d / "missing.yaml") for f in flags for a in f]
    argv = [verb, plan, *fl, *(NO_LAB if "--lab" not in fl else [])]
    rc, out, err = topoctl(argv)
    assert_clean(argv, rc, err, codes=(1,), out=out)


def _cluster_argv(verb: str, cluster: str, d: Path, flags: list[str]) -> list[str]:
    if verb == "inventory":
        return ["inventory", cluster, "-o", str(d / "inv.yml"), *flags]
    if verb == "vagrant":
        return ["vagrant", cluster, "-o", str(d / "Vagrantfile"), *flags]
    return [verb, cluster, *flags]


@fuzz_settings(EXAMPLES)
@given(doc=st.one_of(mutated(st.just(CLUSTER)), st.binary(max_size=40)),
       verb=st.sampled_from(["inventory", "vagrant"]),
       flags=st.lists(st.sampled_from([["--cpus", "0"], ["--cpus", "x"], ["--memory", "-1"],
                                       ["--box", ""], ["--plan", "{missing}"],
                                       ["--plan", "{cluster}"]]), max_size=2))
def test_cluster_file_verbs_any_cluster(doc, verb, flags):
    """`inventory` and `vagrant` on a cluster file with junk at any depth."""
    with tempfile.TemporaryDirectory() as tmp:
        _cluster_case(Path(tmp), doc, verb, flags)


def _cluster_case(d: Path, doc, verb: str, flags: list[list[str]]) -> None:
    data = doc if isinstance(doc, bytes) else yaml.safe_dump(doc).encode()
    cluster = _file(d, "cluster.yaml", data)
    fl = [a.format(missing=d / "missing.yaml", cluster=cluster) for f in flags for a in f]
    if verb == "inventory":
        fl = []  # inventory has no such flags: its bad input is the file
    argv = _cluster_argv(verb, cluster, d, fl)
    rc, out, err = topoctl(argv)
    assert_clean(argv, rc, err, names=None if fl else cluster, out=out)


@fuzz_settings(EXAMPLES // 4)
@given(n=st.one_of(st.integers(-3, 70), st.sampled_from(["x", "1e3", ""])),
       k=st.one_of(st.integers(-2, 9), st.sampled_from(["x", ""])),
       extra=st.lists(st.sampled_from([["--ports", "0"], ["--ports", "9"], ["--ports", "x"],
                                       ["--group-sizes", "2,2"], ["--group-sizes", "3"],
                                       ["--group-sizes", "0"], ["--group-sizes", "x,"],
                                       ["--json"]]), max_size=2))
def test_topology_any_flags(n, k, extra):
    argv = ["topology", "--hosts", str(n), "--degree", str(k), *[a for f in extra for a in f]]
    rc, out, err = topoctl(argv)
    assert_clean(argv, rc, err, out=out)


# found by these fuzzers (tracebacks, exit 70, before the fixes of this branch)
FOUND = [
    (["trees", "--edges", "{edges}", "--chunk-bytes", "-5", "-o", "{dir}/s.yaml"],
     "--chunk-bytes: must be >= 1"),
    (["run", "--iterations", "0", "{plan}", *NO_LAB], "expected a whole number >= 1"),
    (["run", "--timeout", "nan", "{plan}", *NO_LAB], "expected seconds > 0"),
    (["run", "--lab", "BAD", "{plan}"], "lab name 'BAD'"),
    (["apply", "--lab", "Bad_1", "{plan}"], "lab name 'Bad_1'"),
    # printed `error: ...` (not `topoctl: FILE: ...`); an unwritable -o was a traceback
    (["inventory", "{empty}"], "topoctl: {empty}: expected a mapping"),
    (["inventory", "{cluster}", "-o", "/nonexistent/inv.yml"], "topoctl: -o: cannot write"),
    (["vagrant", "{empty}"], "topoctl: {empty}: expected a mapping"),
    (["vagrant", "{cluster}", "--cpus", "0"], "expected --cpus >= 1"),
]


@pytest.mark.parametrize(("argv", "says"), FOUND, ids=[" ".join(a[:3]) for a, _ in FOUND])
def test_found(tmp_path, argv, says):
    files = {"edges": _file(tmp_path, "e.txt", VALID_EDGES.encode()), "dir": str(tmp_path),
             "plan": _file(tmp_path, "p.yaml", yaml.safe_dump(PLAN).encode()),
             "empty": _file(tmp_path, "empty.yaml", b""),
             "cluster": _file(tmp_path, "c.yaml", yaml.safe_dump(
                 CLUSTER | {"hosts": [h | {"address": f"192.0.2.{i + 1}"} for i, h in
                                      enumerate(CLUSTER["hosts"])]}).encode())}
    argv, says = [a.format(**files) for a in argv], says.format(**files)
    rc, _, err = topoctl(argv)
    assert rc == 1 and says in err and "Traceback" not in err, (argv, rc, err)
