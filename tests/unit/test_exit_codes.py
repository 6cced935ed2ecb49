"""The exit-code convention (topoagent.protocol, README "Exit codes") for every verb of both
programs: bad input exits 1 with `PROG: FILE: yaml.path: message` and no traceback; success
codes where they are reachable without a lab. The lab-backed success codes of apply/diff/
status/rollback/run are asserted in tests/e2e/test_rollout.py and tests/e2e/test_training.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from topoagent import cli as agent_cli
from topoagent.protocol import EXIT_BUG, EXIT_CHANGES, EXIT_ERROR, EXIT_OK
from topoctl import cli as topoctl_cli

PLANS = Path(__file__).resolve().parents[2] / "plans"
NOT_UTF8 = b"interfaces: \xff\xfe\n"
BAD_HOSTS_PLAN = {"apiVersion": "topoctl/v1", "kind": "Plan", "metadata": {}, "fabric": {},
                  "hosts": [1, 2], "job": {}}
NO_LAB = ["--lab", "tpxnosuch"]
# --local: no lab or SSH needed to reach the --heal checks, which come before any launch
HEAL_LOCAL = [str(PLANS / "mlp-hetero8-plan.yaml"), "--local", "--hosts", "h0", "--heal"]


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    (tmp_path / "bad.yaml").write_bytes(NOT_UTF8)
    (tmp_path / "badhosts.yaml").write_text(yaml.safe_dump(BAD_HOSTS_PLAN))
    (tmp_path / "edges.txt").write_text("a b 1\nb c 2\nc a 1\n")
    (tmp_path / "badedges.txt").write_text("a b\n")
    (tmp_path / "job.json").write_text(json.dumps({"name": "j", "command": []}))
    return {"dir": str(tmp_path), **{p.stem: str(p) for p in tmp_path.iterdir()},
            "missing": str(tmp_path / "missing.yaml"), "labs": str(tmp_path / "labs")}


# (verb, argv with {placeholders}, expected stderr fragment)
TOPOCTL_BAD = [
    ("plan", ["plan", "{missing}", str(PLANS / "mlp-job.yaml")], "missing.yaml"),
    ("plan", ["plan", "{bad}", str(PLANS / "mlp-job.yaml")], "not UTF-8"),
    ("plan", ["plan"], "required"),
    ("plan", ["plan", "--max-hosts", "0", "{missing}", str(PLANS / "mlp-job.yaml")],
     "expected a whole number >= 1"),
    ("explain", ["explain", "{bad}"], "not UTF-8"),
    ("explain", ["explain", "{badhosts}"], "hosts: missing (a mapping)"),
    ("sync", ["sync", "--edges", "{missing}"], "missing.yaml"),
    ("sync", ["sync", "--edges", "{badedges}"], "expected 'u v capacity'"),
    ("sync", ["sync", "--edges", "{edges}", "-o", "/nonexistent/x.yaml"], "cannot write"),
    ("apply", ["apply", "{badhosts}"], "hosts: missing (a mapping)"),
    ("apply", ["apply", "--confirm-within", "soon", "{badhosts}"], "expected seconds"),
    ("diff", ["diff", "{bad}"], "not UTF-8"),
    ("status", ["status", "{badhosts}"], "hosts: missing"),
    ("rollback", ["rollback", "{missing}"], "missing.yaml"),
    ("run", ["run", "{badhosts}"], "hosts: missing"),
    ("run --heal", ["run", *HEAL_LOCAL], "--job: --heal re-plans the job"),
    ("run --heal", ["run", *HEAL_LOCAL, "--job", str(PLANS / "bert-job.yaml"), "--cluster",
                    str(PLANS / "hetero8-cluster.yaml")], "but the plan was made for 'mlp-lab'"),
    ("run --heal", ["run", *HEAL_LOCAL, "--job", "{missing}"], "missing.yaml"),
    ("run --heal", ["run", *HEAL_LOCAL, "--checkpoint-every", "0"], "whole number >= 1"),
    ("stop", ["stop", "{badhosts}"], "hosts: missing"),
    ("lab up", ["lab", "up", "{bad}", "--state-dir", "{labs}"], "not UTF-8"),
    ("lab status", ["lab", "status", *NO_LAB, "--state-dir", "{labs}"], "no lab tpxnosuch"),
    ("lab cut", ["lab", "cut", *NO_LAB, "--state-dir", "{labs}", "h0:eth0"], "no lab"),
    ("lab heal", ["lab", "heal", *NO_LAB, "--state-dir", "{labs}", "h0:eth0"], "no lab"),
    ("lab measure", ["lab", "measure", *NO_LAB, "--state-dir", "{labs}"], "no lab"),
    ("lab rewire", ["lab", "rewire", *NO_LAB, "--state-dir", "{labs}", "{bad}"], "no lab"),
    ("lab exec", ["lab", "exec", *NO_LAB, "--state-dir", "{labs}", "h0", "true"], "no lab"),
    ("lab down", ["lab", "down", "--bogus"], "unrecognized"),
    ("lab list", ["lab", "list", "--bogus"], "unrecognized"),
    ("bench", ["bench", "nosuch"], "invalid choice"),
]

AGENT_BAD = [
    ("show", ["--netns", "tpxnosuch", "show"], "tpxnosuch"),
    ("diff", ["diff", "{bad}"], "not UTF-8"),
    ("apply", ["apply", "--dry-run", "{bad}"], "not UTF-8"),
    ("apply", ["apply", "--dry-run", "{missing}"], "missing.yaml"),
    ("rollback", ["--netns", "tpxnosuch", "rollback"], "tpxnosuch"),
    ("apply", ["apply", "--confirm-within", "0", "{bad}"], "expected seconds"),
    ("confirm", ["confirm"], "nothing awaits confirmation"),
    ("confirm", ["--netns", "tpxnosuch", "confirm"], "tpxnosuch"),
    ("launch", ["launch", "--host", "h0", "{job}"], "command"),
    ("launch", ["launch", "--host", "h0", "{bad}"], "not UTF-8"),
    ("stop", ["--netns", "tpxnosuch", "stop"], "tpxnosuch"),
    ("usage", ["frobnicate"], "invalid choice"),
]


def _fill(argv: list[str], files: dict[str, str]) -> list[str]:
    return [a.format(**files) for a in argv]


@pytest.mark.parametrize(("verb", "argv", "says"), TOPOCTL_BAD,
                         ids=[f"{v}-{i}" for i, (v, _, _) in enumerate(TOPOCTL_BAD)])
def test_topoctl_bad_input_exits_1(verb, argv, says, files, capsys):
    try:
        rc = topoctl_cli.main(_fill(argv, files))
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == EXIT_ERROR, (verb, rc, err)
    assert says in err and "Traceback" not in err, err


@pytest.mark.parametrize(("verb", "argv", "says"), AGENT_BAD,
                         ids=[f"{v}-{i}" for i, (v, _, _) in enumerate(AGENT_BAD)])
def test_agent_bad_input_exits_1(verb, argv, says, files, capsys):
    try:
        rc = agent_cli.main(["--state-dir", files["dir"], *_fill(argv, files)])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == EXIT_ERROR, (verb, rc, err)
    assert says in err and "Traceback" not in err, err


def test_agent_bad_stdin_is_an_error_document_with_json(files):
    """Non-UTF-8 on stdin (what the controller's transports send) with --json: one JSON error
    document on stdout, exit 1, no traceback."""
    r = subprocess.run([sys.executable, "-m", "topoagent.cli", "--json", "--state-dir",
                        files["dir"], "apply", "--dry-run", "-"], input=NOT_UTF8,
                       capture_output=True, timeout=60)
    assert r.returncode == EXIT_ERROR and b"Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["source"] == "<stdin>"
    assert "not UTF-8" in doc["problems"][0]["message"]


def test_an_unexpected_exception_is_reported_as_a_bug(monkeypatch, capsys):
    import topoctl.cli.sync

    def boom(args):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(topoctl.cli.sync, "run", boom)  # registered when the parser is built
    assert topoctl_cli.main(["sync", "--edges", "x"]) == EXIT_BUG
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err
    assert "this is a bug in topoctl, please report it" in err


def test_topoctl_success_codes(files, tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    job = str(PLANS / "mlp-job.yaml")
    assert topoctl_cli.main(["plan", str(PLANS / "switch8-cluster.yaml"), job, "-o",
                             str(out)]) == EXIT_OK
    assert topoctl_cli.main(["explain", str(out), "--hosts", "h0"]) == EXIT_OK
    assert topoctl_cli.main(["sync", "--edges", files["edges"], "--json"]) == EXIT_OK
    assert topoctl_cli.main(["lab", "list", "--state-dir", files["labs"]]) == EXIT_OK
    capsys.readouterr()


@pytest.mark.netns
def test_agent_success_codes(make_netns, tmp_path, capsys):
    ns = make_netns()
    base = ["--netns", ns, "--state-dir", str(tmp_path / "state")]
    state = tmp_path / "s.yaml"
    state.write_text(yaml.safe_dump({"sysctl": {"ip_forward": True}}))
    empty = tmp_path / "empty.yaml"
    empty.write_text("routes: []\n")  # an explicit (empty) intent, not an empty document

    def agent(*args: str) -> int:
        return agent_cli.main([*base, *args])

    assert agent("show") == EXIT_OK
    assert agent("diff", str(empty)) == EXIT_OK  # nothing to do
    assert agent("diff", str(state)) == EXIT_CHANGES  # pending
    assert agent("apply", "--dry-run", str(state)) == EXIT_CHANGES
    assert agent("apply", "--no-probe", str(state)) == EXIT_CHANGES  # made
    assert agent("apply", "--no-probe", str(state)) == EXIT_OK  # in sync
    assert agent("rollback", "--no-probe") == EXIT_CHANGES
    assert agent("stop") == EXIT_OK  # no ranks running
    capsys.readouterr()


def test_agent_rollback_with_nothing_to_roll_back_is_success(tmp_path, capsys):
    """No earlier applied state: nothing to do, exit 0 with a message (not an error)."""
    base = ["--state-dir", str(tmp_path / "state")]
    assert agent_cli.main([*base, "rollback"]) == EXIT_OK
    assert "nothing to roll back" in capsys.readouterr().out
    assert agent_cli.main([*base, "--json", "rollback", "--dry-run"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["changes"] == 0 and "nothing to roll back" in doc["message"]


class _FakeTransport:
    """Answers every agent call with a fixed exit code per host."""

    name = "fake"

    def __init__(self, rcs: dict[str, int]):
        self.rcs = rcs

    def agent(self, host, args, stdin=None, timeout=120.0):
        from topoctl.rollout.transports import AgentReply

        return AgentReply(host, self.rcs[host], json.dumps({"ok": True, "operations": []}), "")


def test_topoctl_rollback_exit_codes():
    from topoctl.rollout import twophase

    plan = {"hosts": {"h0": {}, "h1": {}}}
    assert twophase.rollback(plan, _FakeTransport({"h0": 0, "h1": 0})).exit_code == EXIT_OK
    rep = twophase.rollback(plan, _FakeTransport({"h0": 2, "h1": 0}))
    assert rep.exit_code == EXIT_CHANGES and "1 of 2" in rep.message
    assert twophase.rollback(plan, _FakeTransport({"h0": 2, "h1": 1})).exit_code == EXIT_ERROR


def test_bench_passes_the_program_exit_code_on(tmp_path, monkeypatch, capsys):
    """`topoctl bench NAME` runs `python -m bench.MODULE` in the checkout, its exit code on."""
    import topoctl.cli.bench as bench

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    (tmp_path / "bench" / "five.py").write_text(
        "import sys\nprint(sys.argv[1:])\nsys.exit(5 if __name__ == '__main__' else 9)\n")
    monkeypatch.setattr(bench, "source_checkout", lambda: tmp_path)
    monkeypatch.setitem(bench.BENCHES, "demo", ("five", "exits 5"))
    assert topoctl_cli.main(["bench", "demo", "--any", "x"]) == 5


def test_bench_outside_a_source_checkout_is_an_error(tmp_path, monkeypatch, capsys):
    """Installed without its checkout (no bench/ package beside it): exit 1 and say why."""
    import topoctl
    import topoctl.cli.bench as bench

    fake = tmp_path / "site" / "topoctl" / "__init__.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("")
    monkeypatch.setattr(topoctl, "__file__", str(fake))
    with pytest.raises(bench.NoCheckoutError, match="source checkout"):
        bench.source_checkout()
    assert topoctl_cli.main(["bench", "demo"]) == EXIT_ERROR
    assert "source checkout" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["demo", "allreduce", "lab-check", "bandwidth", "trees-own"])
def test_bench_usage_errors_exit_1(name, capfd):
    """A bench program's usage error is bad input (1), not argparse's 2 (= changes)."""
    assert topoctl_cli.main(["bench", name, "--bad"]) == EXIT_ERROR
    err = capfd.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_demo_finds_its_cluster_and_job():
    from bench import demo

    assert demo.CLUSTER.is_file() and demo.JOB.is_file()
