"""The README's quickstart, run as written: the first ```sh block under the "Quickstart" heading,
each command in order from the repository root with `.venv/bin` first on PATH, as root. Every
command must exit 0 (README "Exit codes": success is 0 whether or not anything changed); the
plan is written, `run` reports its iterations with identical parameters on every rank, `status`
finds every host in sync. The lab is taken down afterwards whatever happened, and the plan file
the quickstart writes into the checkout is removed (a file that was there before is restored)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
COMMAND_TIMEOUT_S = 900  # the first `plan` on a machine times the model on this CPU


def quickstart_commands(readme: str) -> list[str]:
    """The commands of the first ```sh block after the heading that names the quickstart."""
    lines = readme.splitlines()
    heading = next((i for i, line in enumerate(lines)
                    if line.startswith("#") and "quickstart" in line.lower()), None)
    assert heading is not None, "README.md has no Quickstart heading"
    start = next((i for i in range(heading + 1, len(lines)) if lines[i].strip() == "```sh"), None)
    assert start is not None, "no ```sh block under the README's Quickstart heading"
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("```"))
    return [line.strip() for line in lines[start + 1:end]
            if line.strip() and not line.strip().startswith("#")]


def test_quickstart_block_is_the_whole_walk():
    commands = quickstart_commands((ROOT / "README.md").read_text())
    verbs = [" ".join(shlex.split(c)[1:3]) if shlex.split(c)[1] == "lab" else shlex.split(c)[1]
             for c in commands]
    assert verbs == ["lab up", "plan", "explain", "apply", "run", "status", "rollback", "lab down"]
    assert all(shlex.split(c)[0] == "topoctl" for c in commands)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _topoctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "topoctl"), *args], cwd=ROOT, env=_env(), text=True,
                          capture_output=True, timeout=timeout)


def _option(argv: list[str], *names: str) -> str | None:
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def _lab_name(commands: list[str]) -> str:
    """The lab the quickstart builds: `lab down --lab NAME`, else `lab up --name`, else the
    cluster file's `name`."""
    for c in commands:
        argv = shlex.split(c)
        if argv[1:3] == ["lab", "down"] and _option(argv, "--lab"):
            return _option(argv, "--lab")
    up = next(shlex.split(c) for c in commands if shlex.split(c)[1:3] == ["lab", "up"])
    if _option(up, "--name"):
        return _option(up, "--name")
    cluster = next(w for w in up[3:] if not w.startswith("-"))
    return yaml.safe_load((ROOT / cluster).read_text())["name"]


def _labs() -> list[str]:
    out = _topoctl("lab", "list", "--json")
    return json.loads(out.stdout)["labs"] if out.returncode == 0 else []


@pytest.fixture
def quickstart(tmp_path):
    """The commands, the lab they build and the plan file they write; afterwards the lab is
    taken down and the plan file removed (or restored), also when a command failed."""
    if os.geteuid() != 0:
        pytest.skip("the quickstart needs root (network namespaces)")
    commands = quickstart_commands((ROOT / "README.md").read_text())
    lab = _lab_name(commands)
    if lab in _labs():
        pytest.fail(f"a lab named {lab} is up already: `topoctl lab down --lab {lab}` first")
    plan_argv = next(shlex.split(c) for c in commands if shlex.split(c)[1] == "plan")
    plan_file = ROOT / _option(plan_argv, "-o", "--output")
    backup = tmp_path / "plan-before.yaml"
    if plan_file.exists():
        shutil.copy2(plan_file, backup)
    try:
        yield commands, plan_file
    finally:
        if lab in _labs():
            down = _topoctl("lab", "down", "--lab", lab)
            print(f"cleanup: topoctl lab down --lab {lab}: exit {down.returncode}",
                  down.stdout, down.stderr, file=sys.stderr)
        if backup.exists():
            shutil.copy2(backup, plan_file)
        else:
            plan_file.unlink(missing_ok=True)
        assert lab not in _labs(), f"lab {lab} is still up after the quickstart"


def test_quickstart_runs_as_written(quickstart):
    commands, plan_file = quickstart
    printed: dict[str, str] = {}
    for command in commands:
        argv = shlex.split(command)
        argv[0] = str(VENV_BIN / argv[0])
        done = subprocess.run(argv, cwd=ROOT, env=_env(), text=True, capture_output=True,
                              timeout=COMMAND_TIMEOUT_S)
        assert done.returncode == 0, (
            f"`{command}` exited {done.returncode}\n--- stdout\n{done.stdout}\n"
            f"--- stderr\n{done.stderr}")
        verb = argv[1] if argv[1] != "lab" else f"lab {argv[2]}"
        printed[verb] = done.stdout + done.stderr
        if verb == "plan":
            plan = yaml.safe_load(plan_file.read_text())
            assert plan["kind"] == "Plan" and plan["hosts"], "the plan was not written"
            assert "planned" in printed[verb]

    run = printed["run"]
    iterations = re.search(r"(\d+) ranks, (\d+) iterations in [\d.]+ s; median iteration "
                           r"([\d.]+) s", run)
    assert iterations, f"`run` reported no iterations:\n{run}"
    assert int(iterations.group(2)) >= 1 and float(iterations.group(3)) > 0
    assert "parameters identical on every rank: yes" in run
    assert "predicted iteration" in printed["explain"]
    assert "every host is in sync" in printed["status"]
