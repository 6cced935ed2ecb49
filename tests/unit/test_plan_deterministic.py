"""Plans do not depend on the machine: the same cluster and job give byte-identical plans.

Search budgets are counts (iterations, nodes, seeds), never seconds (topoctl.limits); the
wall-clock safety limit did not cut in, or the plan would say so in metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from topoctl.cli import main
from topoctl.strategies import available

PLANS = Path(__file__).resolve().parents[2] / "plans"


@pytest.mark.parametrize("strategy", sorted(available()))
def test_plan_twice_gives_identical_bytes(strategy, tmp_path, capsys):
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    job["strategies"] = [strategy]
    job["tag"] = {"playouts": 500}  # tag's search: a count (the default 2000 takes ~10 s here)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job))
    outs = []
    for i in range(2):
        out = tmp_path / f"plan{i}.yaml"
        assert main(["plan", str(PLANS / "hetero8-cluster.yaml"), str(job_file), "-o",
                     str(out), "--no-cache"]) == 0
        outs.append(out.read_bytes())
    capsys.readouterr()
    assert outs[0] == outs[1]
    meta = yaml.safe_load(outs[0])["metadata"]
    assert meta["strategy"].endswith(strategy)  # the alias "bandwidth" plans "baseline+bandwidth"
    assert "cut_short" not in meta.get("collective", {})
