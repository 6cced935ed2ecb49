"""Plans do not depend on the machine: the same cluster and job give byte-identical plans.

Search budgets are counts (iterations, nodes, playouts, seeds run to completion), never
seconds (`topoctl.limits`, docs/architecture.md rule 5). A wall clock cuts a search only as a
safety net (`limits.SafetyClock`) or when the job asks for one (`tag.time_limit`), and then the
plan says so: `cut_short` in its metadata, wherever a strategy records its search (trees:
`metadata.collective.cut_short`; tag: `metadata.collective.tag.cut_short`).

Every registered strategy is planned twice; `tag` also on 12 hosts (where its seeds, whole
strategies, take tens of seconds) with two CPU-bound processes beside it during one of the two
plans: under a wall-clock budget the loaded plan comes out different (the 40 s default before
counted budgets: 28.2 s per iteration quiet, 50.3 s loaded).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from topoctl.cli import main
from topoctl.strategies import available

PLANS = Path(__file__).resolve().parents[2] / "plans"
HOG = "while True: pass"  # a CPU-bound process
HOGS = 2  # both cores of this machine busy


# the keys a plan's metadata names a wall clock with: a search the clock cut (`cut_short`, the
# project's one name, `topoctl.limits`; `stopped_by_time`, tag's before its budget was
# counted), a wall-clock limit that governed it (tag's `time_limit`)
CLOCK_KEYS = ("cut_short", "stopped_by_time", "time_limit")


def clock_cuts(doc: object, path: str = "metadata") -> list[str]:
    """Where a plan's metadata names a wall clock (`CLOCK_KEYS` with a true value)."""
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in CLOCK_KEYS and v:
                out.append(f"{path}.{k}: {v}")
            out += clock_cuts(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += clock_cuts(v, f"{path}[{i}]")
    return out


@contextmanager
def cpu_hogs(n: int = HOGS) -> Iterator[list[subprocess.Popen]]:
    """`n` CPU-bound processes for the duration of the block, ended by their pids after it."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def plan_bytes(cluster: str, job: dict, out: Path) -> bytes:
    """The plan `topoctl plan --no-cache` writes for `job` on example `cluster`."""
    job_file = out.with_suffix(".job.yaml")
    job_file.write_text(yaml.safe_dump(job))
    assert main(["plan", str(PLANS / f"{cluster}-cluster.yaml"), str(job_file), "-o", str(out),
                 "--no-cache"]) == 0
    return out.read_bytes()


@pytest.mark.parametrize("strategy", sorted(available()))
def test_plan_twice_gives_identical_bytes(strategy, tmp_path, capsys):
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    job["strategies"] = [strategy]
    job["tag"] = {"playouts": 500}  # tag's search: a count (the default 2000 takes ~10 s here)
    outs = [plan_bytes("hetero8", job, tmp_path / f"plan{i}.yaml") for i in range(2)]
    capsys.readouterr()
    assert outs[0] == outs[1]
    meta = yaml.safe_load(outs[0])["metadata"]
    assert meta["strategy"].endswith(strategy)  # the alias "bandwidth" plans "baseline+bandwidth"
    assert clock_cuts(meta) == []


@pytest.mark.serial  # two CPU hogs: it loads the whole machine while it plans
@pytest.mark.timeout(1200)
def test_tag_plans_the_same_bytes_on_a_loaded_machine(tmp_path, capsys):
    """TAG's default budget is counted: on hetero8 x mlp, with its default budget, the plan
    made beside two CPU hogs is the quiet one, byte for byte, and no clock is named in it.
    (The 40 s clock tag had by default cut topoopt12 x bert by the load: 28.2 s/iteration quiet,
    50.3 s busy; planning that case twice costs minutes of CPU, so the suite plans a small one
    and the test above shows the clock is gone.)"""
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    job["strategies"] = ["tag"]
    quiet = plan_bytes("hetero8", job, tmp_path / "quiet.yaml")
    with cpu_hogs():
        loaded = plan_bytes("hetero8", job, tmp_path / "loaded.yaml")
    capsys.readouterr()
    assert quiet == loaded
    meta = yaml.safe_load(quiet)["metadata"]
    assert clock_cuts(meta) == []


def test_a_wall_clock_cut_is_in_the_plan(tmp_path, capsys):
    """The marker the tests above look for is what `tag` writes when the job's `time_limit`
    cuts it: `cut_short` in the plan's metadata, and `explain` says so."""
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    job["strategies"] = ["tag"]
    job["tag"] = {"playouts": 200, "time_limit": 0.001}
    out = tmp_path / "plan.yaml"
    plan_bytes("hetero8", job, out)
    cuts = clock_cuts(yaml.safe_load(out.read_bytes())["metadata"])
    assert any(".tag.cut_short" in c for c in cuts) and any(".tag.time_limit" in c for c in cuts)
    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    assert "TAG cut by the clock" in capsys.readouterr().out
