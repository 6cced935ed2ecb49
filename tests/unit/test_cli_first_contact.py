"""What a new user meets first on both command lines (issue 50): usage errors answer --json
with a JSON document, each verb's help lists its own flags with an example, the README's list
of --detailed-exitcode verbs is the parsers', `tag train` checks every argument before it trains
and never writes into the installed package without --install, `explain` prints rounded
figures and says what DisCo and SFB chose and why, and a plan `run` would not run as written
is refused like one fed to `apply` (one validation path), naming the YAML path.

The audit's cases are kept as fuzz families (hypothesis, `tests.fuzzgen`): any verb with any
usage error, any bad output path, any collective algorithm or world size."""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import topoctl
from tests.fuzzgen import fuzz_settings
from tests.fuzzgen import topoctl as run_topoctl
from tests.unit.test_exit_codes import AGENT_VERBS, TOPOCTL_VERBS
from topoagent import cli as agent_cli
from topoagent.state.host import StateError
from topoctl import cli as topoctl_cli
from topoctl.render.explain import explain_text
from topoctl.render.validate import validate_plan
from topoctl.rollout.run import job_payload

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "plans"
PLAN = yaml.safe_load((PLANS / "mlp-hetero8-plan.yaml").read_text())
TOPOCTL = [sys.executable, "-m", "topoctl.cli"]
SHIPPED = Path(topoctl.__file__).resolve().parent / "tag" / "weights.json"
EXAMPLES = int(os.environ.get("TOPO_FUZZ_VERB_EXAMPLES", "300")) // 5


def _agent(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = agent_cli.main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    got = capsys.readouterr()
    return rc, got.out, got.err


# ---- item 8: usage errors with --json --------------------------------------------------

BAD_FLAGS = [["--bogus"], ["--iterations", "x"], ["--max-hosts", "0"], ["--seed", "-1"],
             ["--timeout", "nan"], ["--confirm-within", "-3"], ["--hosts"], ["-o"]]


@fuzz_settings(EXAMPLES)
@given(verb=st.sampled_from(sorted(topoctl_cli.VERBS)), bad=st.sampled_from(BAD_FLAGS),
       before=st.booleans())
def test_topoctl_usage_errors_answer_json_on_stdout(verb, bad, before):
    """Any verb, any usage error, --json before or after the verb: exit 1 and one JSON error
    document on stdout (it printed nothing there)."""
    words = [verb, "train"] if verb == "tag" else [verb]
    argv = (["--json", *words, *bad] if before else [*words, *bad, "--json"])
    rc, out, err = run_topoctl(argv)
    if rc != 1 or "usage:" not in err:
        return  # not a usage error of this verb (a verb taking the flag, a missing file)
    doc = json.loads(out)
    assert doc["ok"] is False and doc["exit_code"] == 1 and doc["problems"], (argv, out)
    assert "error:" in err  # the human form stays on stderr


@pytest.mark.parametrize("argv", [["--json", "stop", "--bogus"], ["--json", "watch",
                                  "--interval", "x"], ["--json", "nosuchverb"],
                                  ["--json", "apply"], ["launch", "--json"], ["--json"]])
def test_agent_usage_errors_answer_json_on_stdout(argv, capsys):
    rc, out, err = _agent(argv, capsys)
    assert rc == 1 and "usage:" in err, (argv, rc, err)
    doc = json.loads(out)
    assert doc["ok"] is False and doc["problems"][0]["message"], out


@pytest.mark.parametrize("argv", [["--json"], ["--json", "nosuchverb"], ["tag", "--json"],
                                  ["--json", "lab"], ["lab", "up", "--json", "--bogus"]])
def test_topoctl_usage_errors_without_a_verb_answer_json(argv):
    rc, out, err = run_topoctl(argv)
    assert rc == 1, (argv, err)
    assert json.loads(out)["ok"] is False, (argv, out)


@pytest.mark.parametrize("verb", TOPOCTL_VERBS, ids=" ".join)
def test_every_topoctl_verb_answers_a_usage_error_in_json(verb):
    rc, out, err = run_topoctl([*verb, "--no-such-option", "--json"])
    assert rc == 1 and json.loads(out)["ok"] is False, (verb, out, err)


@pytest.mark.parametrize("verb", AGENT_VERBS)
def test_every_agent_verb_answers_a_usage_error_in_json(verb, capsys):
    rc, out, err = _agent(["--json", verb, "--no-such-option"], capsys)
    assert rc == 1 and json.loads(out)["ok"] is False, (verb, out, err)


def test_usage_errors_without_json_print_nothing_on_stdout(capsys):
    rc, out, err = _agent(["stop", "--bogus"], capsys)
    assert rc == 1 and out == "" and "unrecognized arguments" in err


# ---- item 21: each verb's help ------------------------------------------------------------

def _verb_parsers(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from _verb_parsers(sub, f"{prefix}{name} ")


def _all_verbs():
    yield from (("topoctl", n, p) for n, p in _verb_parsers(topoctl_cli.build_parser()))
    yield from (("topo-agent", n, p) for n, p in _verb_parsers(agent_cli.build_parser()))


def test_each_verbs_help_shows_its_own_flags_and_an_example():
    """No flag of one verb is offered by another's help (`status --help` listed `--dry-run
    (apply)`), and every verb's help ends with an example."""
    verbs = {n for _, n, _ in _all_verbs()}
    for prog, name, p in _all_verbs():
        text = p.format_help()
        assert "example:" in text, (prog, name)
        for action in p._actions:
            said = re.match(r"\((\w[\w-]*)\)", action.help or "")
            if said and said.group(1) in verbs:
                assert said.group(1) == name.split()[-1], (prog, name, action.help)
    status = dict((n, p) for _, n, p in _all_verbs())["status"].format_help()
    assert "--dry-run" not in status and "--no-probe" not in status


def test_the_readme_names_the_detailed_exitcode_verbs_of_each_program():
    """The README's list of verbs taking --detailed-exitcode is what the parsers take, per
    program (`watch` is topo-agent's, not topoctl's)."""
    text = " ".join((ROOT / "README.md").read_text().split())
    for prog in ("topoctl", "topo-agent"):
        listed = re.search(rf"on the `{prog}` verbs (.*?)(, and on|\()", text).group(1)
        said = set(re.findall(r"`([a-z -]+)`", listed))
        takes = {n for p, n, sub in _all_verbs() if p == prog and any(
            "--detailed-exitcode" in a.option_strings for a in sub._actions)}
        assert said == takes, (prog, said, takes)


# ---- items 3 and 12: tag train checks its arguments first ---------------------------------

def _tag_train(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """`topoctl tag train` with the cheapest training; (the process, CPU seconds). Every case
    below must be refused before the training starts (it takes minutes of CPU)."""
    before = os.times()
    r = subprocess.run([*TOPOCTL, "tag", "train", "--rounds", "1", "--playouts", "2",
                        "--epochs", "1", "--clusters", "1", *args], capture_output=True,
                       text=True, cwd=cwd, timeout=300)
    after = os.times()
    return r, (after.children_user + after.children_system
               - before.children_user - before.children_system)


def _bad_outputs(tmp: Path) -> list[list[str]]:
    (tmp / "dir").mkdir(exist_ok=True)
    ro = tmp / "ro"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    pkg = SHIPPED.parent
    return [["-o", ""], ["-o", " "], ["-o", str(tmp / "nosuch" / "w.json")],
            ["-o", str(tmp / "dir")], ["-o", str(SHIPPED)], ["-o", str(pkg / ".." / "x.json")],
            ["-o", str(pkg / ".." / "tag" / "weights.json")], ["--png", ""],
            ["-o", str(tmp / "w.json"), "--png", str(tmp / "nosuch" / "l.png")],
            ["-o", str(tmp / "w.json"), "--png", str(tmp / "dir")],
            ["-o", str(tmp / "w.json"), "--png", str(pkg / "loss.png")],
            ["-o", str(tmp / "w.json"), "--seed", str(2**64)],
            ["-o", str(tmp / "w.json"), "--seed", "-1"],
            ["-o", str(tmp / "w.json"), "--install"], []]


def test_tag_train_refuses_bad_arguments_before_training(tmp_path):
    """The audit's cases and their family: an empty path, a missing or read-only folder, a
    folder for a file, anything inside the installed package without --install, a seed out
    of range, no output at all: exit 1 at once (seconds, not the training's minutes), the
    shipped weights untouched, nothing written."""
    shipped = SHIPPED.read_bytes()
    cases = _bad_outputs(tmp_path)
    if os.geteuid() != 0:
        cases.append(["-o", str(tmp_path / "ro" / "w.json")])  # root writes anywhere
    for args in cases:
        r, cpu = _tag_train(*args, cwd=tmp_path)
        assert r.returncode == 1, (args, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and "capturing" not in r.stderr, (args, r.stderr)
        assert cpu < 30, (args, cpu)  # the interpreter's start, not a training
        assert SHIPPED.read_bytes() == shipped, args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "ro"]


def test_tag_train_png_takes_any_name_and_install_is_explicit(tmp_path):
    """A loss plot named without .png is still a PNG (matplotlib refused the name after the
    training had run); the help offers --install for the shipped prior."""
    r, _ = _tag_train("-o", str(tmp_path / "w.json"), "--png", str(tmp_path / "loss.txt"),
                      cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "loss.txt").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "w.json").read_text())["weights"]
    r = subprocess.run([*TOPOCTL, "tag", "train", "--help"], capture_output=True, text=True)
    assert "--install" in r.stdout and "example:" in r.stdout


# ---- item 20: explain -------------------------------------------------------------------

def _floats_unrounded(doc):
    """`doc` with every float replaced by a long one (as plans hold them)."""
    if isinstance(doc, dict):
        return {k: _floats_unrounded(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_floats_unrounded(v) for v in doc]
    return doc * 1.0000001234567 + 1e-9 if isinstance(doc, float) else doc


LONG = re.compile(r"\d\.\d{5,}|\d{4,}\.\d{2,}")


@pytest.mark.parametrize("name", sorted(p.name for p in PLANS.glob("*-plan.yaml")))
def test_explain_rounds_every_figure(name):
    doc = _floats_unrounded(yaml.safe_load((PLANS / name).read_text()))
    doc["metadata"].setdefault("collective", {})["tag"] = {
        "playouts": 10, "simulated_plans": 3, "speedup_over_baseline": 5.439028873416763}
    doc["metadata"]["bound"]["ratio"] = 1.0712345678
    head = explain_text(doc).split("\nfabric")[0]
    assert "5.439x the baseline" in head and "plan/bound = 1.071" in head
    assert not LONG.findall(head), LONG.findall(head)


def test_explain_shows_disco_buckets_and_why_sfb_chose_no_layer():
    doc = copy.deepcopy(PLAN)
    doc["job"]["collective"]["bucket_plan"] = [
        {"params": ["fc2.weight", "fc2.bias"], "bytes": 4194312},
        {"params": [f"l{i}.weight" for i in range(5)], "bytes": 1000000}]
    doc["metadata"]["collective"] = {
        "disco": {"fusion": "none", "buckets": 2, "overlap": "backward",
                  "anchors": {"ddp-default": 0.0123456789}, "gap_closed": 0.87654321},
        "sfb": {"layers": {}, "candidates": 9, "objective_s": 0.0,
                "gathered_bytes_per_replica": 0,
                "closest": {"module": "fc3", "op": "fc3", "saved_s": 0.0012345678,
                            "cost_s": 0.0034567891}}}
    text = explain_text(doc)
    assert "DisCo: 2 gradient bucket(s)" in text
    assert "bucket 0: 4.194 MB, 2 parameter(s): fc2.weight, fc2.bias" in text
    assert "bucket 1: 1 MB, 5 parameter(s): l0.weight, l1.weight, l2.weight, ... (5 in all)" \
        in text
    assert "0 of 9 fully connected layer(s)" in text
    assert "none pays: the closest, fc3, would save 1.235 ms" in text and "3.457 ms" in text


def test_sfb_notes_say_which_layer_came_closest():
    """The planner writes what `explain` reads: with every candidate left out, the one nearest
    to paying, with its saving and cost (`strategies.sfb.closest_left_out`)."""
    from topoctl.strategies.sfb import closest_left_out
    info = {"a": ("m.a", 1, 2, 3, 4), "b": ("m.b", 1, 2, 3, 4)}
    near = closest_left_out([], info, {"a": (1.0, 3.0), "b": (2.0, 3.0)})
    assert near == {"module": "m.b", "op": "b", "saved_s": 2.0, "cost_s": 3.0}
    assert closest_left_out(["a", "b"], info, {"a": (1.0, 3.0), "b": (2.0, 3.0)}) is None


# ---- items 6 and 9: a plan fed to `run` is validated as one fed to `apply` ---------------

ALGORITHMS = st.one_of(st.sampled_from(["bogus", "Ring", "tree", "", "allreduce", "nccl"]),
                       st.text(max_size=8).filter(lambda a: a not in ("ring", "trees",
                                                                      "pipeline")),
                       st.integers(), st.none().map(lambda _: ["ring"]))


@fuzz_settings(EXAMPLES)
@given(algo=ALGORITHMS)
def test_an_unknown_collective_algorithm_is_refused_where_plans_are_read(algo):
    doc = copy.deepcopy(PLAN)
    doc["job"]["collective"]["algorithm"] = algo
    assert any(p == "job.collective.algorithm" for p, _ in validate_plan(doc)), algo
    with pytest.raises(StateError) as e:
        job_payload(doc, 3)
    assert e.value.path == "job.collective.algorithm"


@fuzz_settings(EXAMPLES)
@given(world=st.integers(1, 64), dup=st.booleans())
def test_world_size_and_ranks_must_be_the_processes(world, dup):
    doc = copy.deepcopy(PLAN)
    ranks = sum(len(v) for v in doc["job"]["processes"].values())
    doc["job"]["world_size"] = world
    if dup:  # a rank given twice, the count kept
        doc["job"]["world_size"] = ranks
        first = next(iter(doc["job"]["processes"].values()))
        first[0]["rank"] = (first[0]["rank"] + 1) % ranks
    bad = world != ranks or dup
    problems = validate_plan(doc)
    assert bool([p for p, _ in problems if p in ("job.world_size", "job.processes")]) == bad


def test_a_tree_schedule_for_another_world_size_is_refused():
    doc = copy.deepcopy(PLAN)
    n = doc["job"]["world_size"]
    doc["job"]["collective"] = {"algorithm": "trees", "schedule": {
        "world_size": n + 1, "trees": [{"root": 0, "rate": 1.0,
                                        "parents": [None] + [0] * n}]}}
    assert ("job.collective.schedule.world_size",
            f"{n + 1}: the job runs {n} ranks") in validate_plan(doc)
    doc["job"]["collective"] = {"algorithm": "trees"}
    assert [p for p, _ in validate_plan(doc)] == ["job.collective.schedule"]


@pytest.mark.parametrize(("model", "path"), [
    ({"catalog": "nosuch"}, "job.model.catalog"), ({"catalog": 3}, "job.model.catalog"),
    ({"catalog": "mlp", "params": {"nosuch": 1}}, "job.model.params"),
    ({"catalog": "mlp", "params": {"layers": -1}}, "job.model.params"),
    ({"catalog": "mlp", "params": [1]}, "job.model.params")])
def test_run_refuses_an_unknown_catalog_model_naming_the_path(model, path, tmp_path):
    """`topoctl run` on the plan: exit 1 naming the file and the YAML path, before any host
    (--local: the launch would be this machine's), never a KeyError (exit 70)."""
    doc = copy.deepcopy(PLAN)
    doc["job"]["model"] = model
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(doc))
    host = sorted(doc["hosts"])[0]
    t0 = time.monotonic()
    r = subprocess.run([*TOPOCTL, "run", str(plan), "--local", "--hosts", host],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr[-3000:])
    assert f"{path}:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert time.monotonic() - t0 < 300
