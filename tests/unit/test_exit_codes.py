"""The exit-code convention (topoagent.protocol, README "Exit codes") for every verb of both
programs: 0 success (changes made or not), 1 error (bad input, usage errors included: argparse's
own 2 never), 3 partial, 70 a bug, 130 interrupted; `--detailed-exitcode` on the verbs that
change or compare state: 2 changes made or pending / drift, 0 nothing to do. Bad input exits 1
with `PROG: FILE: yaml.path: message` and no traceback. The rollout verbs (apply, diff, status,
rollback, stop) run here against a fake transport that answers as agents called with
--detailed-exitcode do; the lab-backed codes (lab up/down/cut/heal/measure/rewire, run) are
asserted in tests/e2e/test_rollout.py, tests/e2e/test_training.py and
tests/integration/test_lab_cabling.py. Also: --version of both programs, --json before and after
the verb, the hidden `sync` and `confirm-watchdog` verbs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import topoagent
import topoctl
from topoagent import cli as agent_cli
from topoagent.protocol import (
    EXIT_BUG,
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
)
from topoctl import cli as topoctl_cli
from topoctl.rollout.transports import AgentReply, agent_argv

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "plans"
PLAN = str(PLANS / "mlp-hetero8-plan.yaml")
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
    (tmp_path / "badcluster.yaml").write_text("name: x\nhosts: 5\n")
    (tmp_path / "badstate.yaml").write_text("routes: 5\n")
    cluster = yaml.safe_load((PLANS / "switch8-cluster.yaml").read_text())
    for i, h in enumerate(cluster["hosts"]):  # inventory needs SSH addresses
        h["address"] = f"192.0.2.{i + 1}"
    (tmp_path / "addressed.yaml").write_text(yaml.safe_dump(cluster))
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
    ("trees", ["trees", "--edges", "{missing}"], "missing.yaml"),
    ("trees", ["trees", "--edges", "{badedges}"], "expected 'u v capacity'"),
    ("trees", ["trees", "--edges", "{edges}", "-o", "/nonexistent/x.yaml"], "cannot write"),
    ("sync", ["sync", "--edges", "{badedges}"], "expected 'u v capacity'"),
    ("topology", ["topology", "-n", "12", "-d", "4", "--group-sizes", "5"], "--group-sizes"),
    ("inventory", ["inventory", "{badcluster}"], "badcluster.yaml: hosts:"),
    ("vagrant", ["vagrant", "{badcluster}"], "badcluster.yaml: hosts:"),
    ("plan", ["plan", "{badcluster}", str(PLANS / "mlp-job.yaml")], "badcluster.yaml: hosts:"),
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
    ("confirm", ["confirm", "--probe", "{missing}"], "missing.yaml"),
    ("confirm-probe", ["confirm-probe"], "nothing awaits confirmation"),
    ("confirm-probe", ["confirm-probe", "--bytes", "1000"], "expected bytes"),
    ("diff", ["--mgmt-floor", "fast", "diff", "{bad}"], "not a rate"),
    ("launch", ["launch", "--host", "h0", "{job}"], "command"),
    ("launch", ["launch", "--host", "h0", "{bad}"], "not UTF-8"),
    ("stop", ["--netns", "tpxnosuch", "stop"], "tpxnosuch"),
    ("diff", ["diff", "{badstate}"], "badstate.yaml: routes:"),
    ("apply", ["apply", "{badstate}"], "badstate.yaml: routes:"),
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
    import topoctl.cli.trees

    def boom(args):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(topoctl.cli.trees, "run", boom)  # registered when the parser is built
    assert topoctl_cli.main(["trees", "--edges", "x"]) == EXIT_BUG
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err
    assert "this is a bug in topoctl, please report it" in err


def test_topoctl_success_codes(files, tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    job = str(PLANS / "mlp-job.yaml")
    assert topoctl_cli.main(["plan", str(PLANS / "switch8-cluster.yaml"), job, "-o",
                             str(out)]) == EXIT_OK
    assert topoctl_cli.main(["explain", str(out), "--hosts", "h0"]) == EXIT_OK
    assert topoctl_cli.main(["trees", "--edges", files["edges"], "--json"]) == EXIT_OK
    assert topoctl_cli.main(["topology", "--hosts", "8", "--degree", "4"]) == EXIT_OK
    inv = str(tmp_path / "inv.yml")
    assert topoctl_cli.main(["inventory", files["addressed"], "-o", inv]) == EXIT_OK
    assert topoctl_cli.main(["vagrant", str(PLANS / "switch8-cluster.yaml"), "-o",
                             str(tmp_path / "Vagrantfile")]) == EXIT_OK
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

    d = "--detailed-exitcode"
    assert agent("show") == EXIT_OK
    assert agent("diff", str(empty)) == EXIT_OK  # nothing to do
    assert agent("diff", d, str(empty)) == EXIT_OK
    assert agent("diff", str(state)) == EXIT_OK  # pending: success all the same
    assert agent("diff", d, str(state)) == EXIT_CHANGES  # pending, when asked
    assert agent(d, "diff", str(state)) == EXIT_CHANGES  # before the verb too
    assert agent("apply", "--dry-run", str(state)) == EXIT_OK
    assert agent("apply", "--dry-run", d, str(state)) == EXIT_CHANGES
    assert agent("apply", "--no-probe", d, str(state)) == EXIT_CHANGES  # made
    assert agent("apply", "--no-probe", d, str(state)) == EXIT_OK  # in sync
    assert agent("apply", "--no-probe", str(state)) == EXIT_OK
    assert agent("watch", "--once", d) == EXIT_OK  # in sync
    assert agent("rollback", "--no-probe", d) == EXIT_CHANGES  # rolled back
    assert agent("apply", "--no-probe", str(state)) == EXIT_OK  # made, without the flag
    assert agent("rollback", "--no-probe") == EXIT_OK  # rolled back, without the flag
    assert agent("apply", "--no-probe", "--confirm-within", "30", str(state)) == EXIT_OK
    assert agent("confirm", "--no-probe") == EXIT_OK
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=0"],
                   check=True)  # drift from the applied state
    assert agent("watch", "--once") == EXIT_OK
    assert agent("watch", "--once", d) == EXIT_CHANGES  # drifted
    assert agent("watch", "--once", "--repair", d) == EXIT_CHANGES  # repaired
    assert agent("watch", "--once", d) == EXIT_OK  # in sync again
    assert agent("stop") == EXIT_OK  # no ranks running
    assert agent("stop", d) == EXIT_OK
    assert agent("recover", d) == EXIT_OK  # nothing to recover
    capsys.readouterr()


def test_agent_rollback_with_nothing_to_roll_back_is_success(tmp_path, capsys):
    """No earlier applied state: nothing to do, exit 0 with a message (not an error)."""
    base = ["--state-dir", str(tmp_path / "state")]
    assert agent_cli.main([*base, "rollback"]) == EXIT_OK
    assert "nothing to roll back" in capsys.readouterr().out
    assert agent_cli.main([*base, "--json", "rollback", "--dry-run"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["changes"] == 0 and "nothing to roll back" in doc["message"]


def test_agent_verbs_without_a_namespace(tmp_path, capsys):
    """The verbs that need no host change: nothing to do is 0, with --detailed-exitcode too."""
    base = ["--state-dir", str(tmp_path / "state")]
    for argv in (["recover"], ["recover", "--detailed-exitcode"], ["stop"],
                 ["stop", "--detailed-exitcode"], ["watch", "--once"],
                 ["watch", "--once", "--detailed-exitcode"], ["rollback", "--detailed-exitcode"]):
        assert agent_cli.main([*base, *argv]) == EXIT_OK, argv
    capsys.readouterr()


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
    from bench.demo import run as demo

    assert demo.CLUSTER.is_file() and demo.JOB.is_file()


# --- the rollout verbs through the CLI, against agents that answer as real ones do -------------

class _Agents:
    """A transport whose agents answer as `topo-agent --json --detailed-exitcode` does: with
    `pending`, diff/apply/rollback/stop change something (2), else nothing to do (0); hosts in
    `fail` refuse their apply (1)."""

    name = "fake"

    def __init__(self, pending: bool, fail: tuple[str, ...] = ()):
        self.pending, self.fail = pending, set(fail)

    def agent(self, host, args, stdin=None, timeout=120.0):
        verb = next(a for a in args if not a.startswith("-"))
        if verb == "apply" and host in self.fail:
            return AgentReply(host, EXIT_ERROR, json.dumps({
                "ok": False, "error": "refused", "problems": [
                    {"path": "routes[0]", "message": "refused"}]}), "")
        changed = self.pending and verb in ("diff", "apply", "rollback", "stop")
        ops = [{"what": "add route 10.231.9.0/24"}] if changed else []
        return AgentReply(host, EXIT_CHANGES if changed else EXIT_OK, json.dumps(
            {"ok": True, "changes": len(ops), "operations": ops, "stopped": int(changed)}), "")

    def close(self):
        pass


@pytest.mark.parametrize("verb", ["apply", "diff", "status", "rollback", "stop"])
def test_rollout_verbs_exit_0_and_2_only_when_asked(verb, monkeypatch, capsys):
    import topoctl.cli.apply as apply_cli

    agents = {"pending": _Agents(True)}
    monkeypatch.setattr(apply_cli, "pick_transport", lambda args, plan: agents["pending"])
    main = topoctl_cli.main
    assert main([verb, PLAN]) == EXIT_OK  # changes made / pending: success
    assert main([verb, PLAN, "--detailed-exitcode"]) == EXIT_CHANGES
    assert main(["--detailed-exitcode", verb, PLAN]) == EXIT_CHANGES  # before the verb too
    agents["pending"] = _Agents(False)
    assert main([verb, PLAN]) == EXIT_OK  # nothing to do
    assert main([verb, PLAN, "--detailed-exitcode"]) == EXIT_OK
    capsys.readouterr()
    for argv in ([verb, PLAN, "--json"], ["--json", verb, PLAN]):  # --json before or after
        agents["pending"] = _Agents(True)
        assert main(argv) == EXIT_OK
        out = capsys.readouterr().out
        doc = json.loads(out)
        if verb != "stop":  # stop's document: host -> the agent's code
            assert doc["exit_code"] == EXIT_OK and doc["changed"] is True, doc


def test_apply_dry_run_and_partial(monkeypatch, capsys):
    import topoctl.cli.apply as apply_cli

    monkeypatch.setattr(apply_cli, "pick_transport", lambda args, plan: _Agents(True))
    assert topoctl_cli.main(["apply", PLAN, "--dry-run"]) == EXIT_OK
    assert topoctl_cli.main(["apply", PLAN, "--dry-run", "--detailed-exitcode"]) == EXIT_CHANGES
    monkeypatch.setattr(apply_cli, "pick_transport", lambda args, plan: _Agents(True, ("h3",)))
    # some hosts failed, the others rolled back: 3 with or without --detailed-exitcode
    assert topoctl_cli.main(["apply", PLAN]) == EXIT_PARTIAL
    assert topoctl_cli.main(["apply", PLAN, "--detailed-exitcode"]) == EXIT_PARTIAL
    out = capsys.readouterr().out
    assert "apply failed on h3" in out and "rolled back" in out


def test_a_set_e_script_goes_on_after_a_successful_apply(monkeypatch, capsys):
    """The issue: `topoctl apply plan.yaml && topoctl run plan.yaml` stopped after an apply
    that changed something."""
    import topoctl.cli.apply as apply_cli

    monkeypatch.setattr(apply_cli, "pick_transport", lambda args, plan: _Agents(True))
    assert topoctl_cli.main(["apply", PLAN]) == 0
    capsys.readouterr()


def test_the_controller_asks_agents_for_detailed_exit_codes():
    """The rollout reads "changed" from the agent's exit code 2: every transport passes
    --detailed-exitcode, and so do the Ansible playbooks (their changed_when reads rc == 2)."""
    assert "--detailed-exitcode" in agent_argv(["topo-agent"], None)
    assert "'--detailed-exitcode'" in (ROOT / "playbooks" / "vars" / "agent.yml").read_text()


def test_an_agent_exit_2_without_its_json_is_an_error():
    """An agent that does not know --detailed-exitcode (or any 2 without a success document)
    is not read as "changed"."""
    from topoctl.rollout.twophase import _event

    e = _event(AgentReply("h0", 2, "", "usage: topo-agent ...\nerror: unrecognized"), "prepare",
               0.0, "in sync", "changes")
    assert e.result == "error"


# --- usage errors: 1 on every verb of both programs -------------------------------------------

TOPOCTL_VERBS = [["apply"], ["diff"], ["status"], ["rollback"], ["run"], ["stop"], ["plan"],
                 ["explain"], ["inventory"], ["vagrant"], ["trees"], ["sync"], ["topology"],
                 ["bench"], ["lab"], ["lab", "up"], ["lab", "down"], ["lab", "status"],
                 ["lab", "cut"], ["lab", "heal"], ["lab", "measure"], ["lab", "rewire"],
                 ["lab", "exec"], ["lab", "list"]]
AGENT_VERBS = ["show", "diff", "apply", "confirm", "confirm-probe", "confirm-watchdog",
               "rollback", "launch", "watch", "stop", "recover"]


@pytest.mark.parametrize("verb", TOPOCTL_VERBS, ids=" ".join)
def test_topoctl_usage_error_exits_1(verb, capsys):
    with pytest.raises(SystemExit) as e:
        topoctl_cli.main([*verb, "--no-such-option"])
    assert e.value.code == EXIT_ERROR
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("verb", AGENT_VERBS)
def test_agent_usage_error_exits_1(verb, capsys):
    with pytest.raises(SystemExit) as e:
        agent_cli.main([verb, "--no-such-option"])
    assert e.value.code == EXIT_ERROR
    assert "Traceback" not in capsys.readouterr().err


def test_interrupted_is_130(monkeypatch, capsys):
    import topoctl.cli.trees

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(topoctl.cli.trees, "run", interrupted)
    assert topoctl_cli.main(["trees", "--edges", "x"]) == EXIT_INTERRUPTED == 130
    assert "interrupted" in capsys.readouterr().err


# --- --version, --json, help -------------------------------------------------------------------

def test_version_of_both_programs(capsys):
    for main, name, version in ((topoctl_cli.main, "topoctl", topoctl.__version__),
                                (agent_cli.main, "topo-agent", topoagent.__version__)):
        with pytest.raises(SystemExit) as e:
            main(["--version"])
        assert e.value.code == EXIT_OK
        assert capsys.readouterr().out.strip() == f"{name} {version}"


def test_version_of_the_installed_commands():
    for prog, module in (("topoctl", "topoctl.cli"), ("topo-agent", "topoagent.cli")):
        r = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == f"{prog} 0.1.0", r


def _json_out(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("where", ["before", "after"])
def test_json_before_and_after_the_verb(where, files, tmp_path, capsys):
    def run(verb: list[str], *rest: str) -> dict:
        argv = ["--json", *verb, *rest] if where == "before" else [*verb, *rest, "--json"]
        assert topoctl_cli.main(argv) == EXIT_OK, argv
        return _json_out(capsys)

    out = tmp_path / "plan.yaml"
    doc = run(["plan"], str(PLANS / "switch8-cluster.yaml"), str(PLANS / "mlp-job.yaml"), "-o",
              str(out))
    assert doc["ok"] and doc["output"] == str(out) and doc["hosts"] == 8 and doc["strategy"]
    doc = run(["explain"], str(out), "--hosts", "h0")
    assert doc["hosts"] == ["h0"] and "h0" in doc["explain"]
    doc = run(["inventory"], files["addressed"])
    assert doc["output"] is None and len(doc["hosts"]) == 8 and "inventory" in doc
    doc = run(["vagrant"], str(PLANS / "switch8-cluster.yaml"), "-o", str(tmp_path / "Vf"))
    assert doc["output"] == str(tmp_path / "Vf") and len(doc["vms"]) == 8
    assert run(["trees"], "--edges", files["edges"])["trees"]
    assert run(["topology"], "--hosts", "8", "--degree", "4")["hosts"] == 8
    assert isinstance(run(["lab", "list"], "--state-dir", files["labs"])["labs"], list)
    # the agent
    base = ["--state-dir", str(tmp_path / "state")]
    for verb in (["rollback"], ["recover"], ["stop"], ["watch", "--once"]):
        argv = ["--json", *base, *verb] if where == "before" else [*base, *verb, "--json"]
        assert agent_cli.main(argv) == EXIT_OK
        assert _json_out(capsys)["ok"] is True


def test_json_errors_are_one_document(files, capsys):
    assert topoctl_cli.main(["explain", files["badhosts"], "--json"]) == EXIT_ERROR
    doc = _json_out(capsys)
    assert doc["ok"] is False and doc["source"] == files["badhosts"]
    assert doc["problems"][0]["path"] == "hosts"


def test_trees_is_the_verb_and_sync_its_hidden_deprecated_alias(files, tmp_path, capsys):
    sched = tmp_path / "s.yaml"
    assert topoctl_cli.main(["trees", "--edges", files["edges"], "-o", str(sched)]) == EXIT_OK
    assert sched.is_file() and "deprecat" not in capsys.readouterr().err
    old = tmp_path / "old.yaml"
    assert topoctl_cli.main(["sync", "--edges", files["edges"], "--schedule", str(old)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`topoctl sync` is now `topoctl trees`" in err
    assert old.read_text() == sched.read_text()
    help_text = topoctl_cli.build_parser().format_help()
    assert " trees " in help_text and " sync " not in help_text


def test_help_is_for_users(capsys):
    """One line of what the program does, no developer docstring; every verb has an example;
    the internal confirm-watchdog verb is not listed (it still parses)."""
    top = topoctl_cli.build_parser()
    text = top.format_help()
    assert "plan the network of a distributed DNN training job" in text
    assert "registers itself" not in text and "COMMANDS" not in text
    agent = agent_cli.build_parser()
    assert "confirm-watchdog" not in agent.format_help()
    assert agent.parse_args(["confirm-watchdog", "tok"]).token == "tok"
    for parser in (top, agent):
        sub = next(a for a in parser._actions if a.dest == "command")
        for name, p in sub.choices.items():
            if name == "lab":
                lab = next(a for a in p._actions if a.dest == "lab_command")
                for n, q in lab.choices.items():
                    assert (q.epilog or "").startswith("example: "), n
            assert (p.epilog or "").startswith("example: "), name
