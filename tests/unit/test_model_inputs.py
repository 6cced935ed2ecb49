"""A job's own model meets inputs it cannot take (issue 50, items 15, 16, 7, 19): `topoctl
plan` answers with one readable line naming `model.inputs` and the cause (not torch's ShapeProp
dump with literal \\n's and "Original traceback: None"); an integer input range the model
cannot index (high 5000 into an Embedding of 1000 rows) is refused at plan time, not found by
every rank's IndexError; a training step that cannot be timed says why; a factory that returns
no Module is refused at `model.factory`; `plan --retime` says what it is timing.

Real parts: the factory runs in the capture child as the unprivileged capture user, the plans
go through the CLI in process (`tests.fuzzgen.topoctl`) or as a program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzzgen import fuzz_settings, topoctl

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user "
                                                          "(CI runs as root)")

PLANS = Path(__file__).resolve().parents[2] / "plans"
FACTORY = '''
import torch
from torch import nn

def embed(vocab=1000, width=16, tokens=8):
    return nn.Sequential(nn.Embedding(vocab, width), nn.Flatten(), nn.Linear(width * tokens, 4))

class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
    def forward(self, x):
        return self.fc(x).detach()  # nothing to differentiate: a step cannot be timed

def detached():
    return Detached()

def not_a_module():
    return {"a": 1}
'''
CLUSTER = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "fzin",
           "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "A100"}},
           "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                     for i in range(2)],
           "fabric": {"kind": "direct", "links": [{"a": "h0:eth0", "b": "h1:eth1"}]}}


@pytest.fixture(scope="module")
def files():
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="tpt-inputs-"))
    os.chmod(d, 0o755)
    (d / "tpt_inputs_factory.py").write_text(FACTORY)
    (d / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    sys.path.insert(0, str(d))
    yield d
    sys.path.remove(str(d))
    shutil.rmtree(d, ignore_errors=True)


def _plan(d: Path, factory: str, inputs: list[dict], name: str = "job.yaml"):
    job = {"apiVersion": "topoctl/v1", "kind": "Job", "name": "inp",
           "model": {"factory": f"tpt_inputs_factory:{factory}", "inputs": inputs},
           "batch": {"global": 4}, "strategies": ["baseline"],
           "cost": {"method": "roofline", "device": "A100"}}
    (d / name).write_text(yaml.safe_dump(job))
    argv = ["plan", str(d / "cluster.yaml"), str(d / name), "-o", str(d / "plan.yaml")]
    return topoctl(argv)


def _one_readable_line(err: str, path: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("topoctl: ")]
    assert len(lines) == 1, err
    assert f": {path}: " in lines[0], err
    for junk in ("ShapeProp", "Original traceback", "\\n", "Traceback", "meta={"):
        assert junk not in err, (junk, err)
    return lines[0]


# the audit's case (float indices into an Embedding) and its family: wrong dtypes and shapes
WRONG = st.sampled_from([
    ([{"shape": [8], "dtype": "float32"}], "indices"),
    ([{"shape": [8], "dtype": "float16"}], "indices"),
    ([{"shape": [8, 3], "dtype": "int64", "high": 10}], "at module '2'"),  # the Linear
    ([{"shape": [5], "dtype": "int64", "high": 10}], "at module '2'"),
    ([{"shape": [8], "dtype": "int64", "high": 10}, {"shape": [2]}], ""),
])


@fuzz_settings(3)
@given(case=WRONG)
def test_a_wrong_input_dtype_or_shape_is_one_line_with_the_cause(files, case):
    inputs, cause = case
    rc, _, err = _plan(files, "embed", inputs)
    assert rc == 1, err
    line = _one_readable_line(err, "model.inputs")
    assert cause in line and "per sample" in line, line


@pytest.mark.parametrize(("high", "ok"), [(5000, False), (1001, False), (2**31, False),
                                          (1000, True), (1, True)])
def test_an_input_range_the_model_cannot_index_is_refused(files, high, ok):
    """`high` beyond the Embedding's 1000 rows: refused at plan time naming model.inputs and
    the IndexError (the meta capture cannot see values: the model runs one real sample
    holding the range's extremes); within it: planned."""
    rc, _, err = _plan(files, "embed", [{"shape": [8], "dtype": "int64", "high": high}])
    if ok:
        assert rc == 0, err
        return
    assert rc == 1, err
    line = _one_readable_line(err, "model.inputs")
    assert "IndexError" in line and f"values 0..{high - 1}" in line, line


def test_a_factory_that_returns_no_module_is_refused_at_plan_time(files):
    rc, _, err = _plan(files, "not_a_module", [{"shape": [8]}])
    assert rc == 1
    assert "not a torch.nn.Module" in _one_readable_line(err, "model.factory")


def test_a_training_step_that_cannot_be_timed_says_why(files, capsys):
    """The timing fails (nothing to differentiate): no timing, and a warning saying why on
    stderr (`graph/profile.py` swallowed it, and the cost silently changed source)."""
    from topoctl.graph.sandbox import factory_train_costs
    from topoctl.spec.job import parse_job
    job = parse_job({"apiVersion": "topoctl/v1", "kind": "Job", "name": "det",
                     "model": {"factory": "tpt_inputs_factory:detached",
                               "inputs": [{"shape": [8]}]},
                     "batch": {"global": 4}, "strategies": ["baseline"]})
    assert factory_train_costs(job, 2) is None
    err = capsys.readouterr().err
    assert "timing a training step of tpt_inputs_factory:detached at batch 2 failed" in err
    assert "RuntimeError" in err and "grad" in err, err


def test_plan_retime_says_what_it_is_timing(tmp_path):
    """`plan --retime` on a lab cluster (ranks timed on this CPU): progress lines on stderr as
    each step starts (it printed nothing for a minute), stdout one JSON document."""
    r = subprocess.run([sys.executable, "-m", "topoctl.cli", "--json", "plan", "--retime",
                        str(PLANS / "mesh4-cluster.yaml"), str(PLANS / "mlp-job.yaml"),
                        "-o", str(tmp_path / "plan.yaml")],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["ok"] is True
    steps = [ln for ln in r.stderr.splitlines() if ln.startswith("topoctl plan [")]
    said = "\n".join(steps)
    for step in ("capturing mlp", "measuring the tree runtime's CPU costs",
                 "timing a training step of mlp on this CPU", "planning strategy baseline"):
        assert step in said, (step, r.stderr)
    assert said.index("capturing") < said.index("timing") < said.index("planning strategy")
