"""A user's own, unmodified torchrun-style DDP script (examples/ddp_own_data.py) trained
through `topoctl run` in a 4-host lab: its own data loader, env:// initialisation, no
reporting. The run is supervised by exit status; every rank ends with the same parameters
(printed by the script); a `trees` plan hands the ranks its schedule in $TOPO_TREE_SCHEDULE
and `register_tree_hook(model)`, as docs/trees.md shows it, finds it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_training import CLUSTER, JOB
from topoctl import cli
from topoctl.lab import lab as labmod
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

pytestmark = pytest.mark.netns

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "ddp_own_data.py"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    labs = tmp_path_factory.mktemp("labs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOCTL_LAB_DIR", str(labs))
        name = f"us{os.getpid() % 10**6}"
        lab = labmod.up(parse_cluster(CLUSTER), name=name, with_ssh=False)
        try:
            yield lab
        finally:
            labmod.down(name)


def own_script_plan(tmp_path: Path, strategy: str) -> str:
    job = {**JOB, "strategies": [strategy],
           "launch": {"command": ["python3", str(SCRIPT)], "iterations": 1}}
    plan, _, _ = make_plan(parse_cluster(CLUSTER), parse_job(job), use_cache=False)
    path = tmp_path / f"{strategy}-plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("strategy", ["baseline", "trees"])
def test_unmodified_ddp_script_trains_through_topoctl_run(lab, strategy, tmp_path, capsys):
    plan = own_script_plan(tmp_path, strategy)
    assert cli.main(["apply", plan, "--lab", lab.name]) == 0
    try:
        capsys.readouterr()
        code = cli.main(["run", plan, "--lab", lab.name, "--verbose", "--timeout", "300"])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "4 ranks ended with exit status 0" in out
        assert re.search(r"epoch 1: loss \d", out)
        sums = set(re.findall(r"rank \d: parameter sum (\S+)", out))
        assert len(re.findall(r"rank \d: parameter sum", out)) == 4 and len(sums) == 1, out
        hooked = re.findall(r"rank \d: tree hook over (\d+) tree", out)
        assert len(hooked) == (4 if strategy == "trees" else 0), out
    finally:
        assert cli.main(["rollback", plan, "--lab", lab.name]) == 0
