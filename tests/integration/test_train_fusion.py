"""Operator fusion in the runtime (`topotrain.fusion`): two real gloo ranks on loopback run
`python -m topotrain.train` with the whole model compiled by inductor and train to the losses
of the eager run (fp tolerance), with a `fusion` event reporting the compile; in process, a
region (CANDLE-Uno's head) compiled gives the eager gradients, and the two fallbacks (a
compiler that raises, a spent budget) leave the region eager, in the report and on stderr."""

from __future__ import annotations

import sys

import pytest

from tests.integration.test_pipeline_runtime import run_local

torch = pytest.importorskip("torch")

from topocontract.fusion import FusionPlan, parse_fusion  # noqa: E402
from topoctl.catalog.dense import MLP, CandleUno  # noqa: E402
from topoctl.catalog.transformer import BertEncoder  # noqa: E402
from topotrain.fusion import apply_fusion  # noqa: E402

WORLD = 2
KWARGS = {"layers": 2, "hidden": 32, "features": 12, "classes": 4}
JOB = {
    "name": "fuse", "command": [sys.executable, "-m", "topotrain.train"], "world_size": WORLD,
    "master": {"address": "127.0.0.1", "port": 29500}, "iterations": 8, "lr": 0.05,
    "seed": 5, "batch": {"global": 8, "per_rank": 4}, "bucket_cap_mb": 0.01,
    "model": {"factory": "topoctl.catalog.dense:MLP", "kwargs": KWARGS,
              "inputs": [{"shape": [KWARGS["features"]]}]},
    "processes": {f"h{r}": [{"rank": r, "local_rank": 0,
                             "env": {"RANK": str(r), "WORLD_SIZE": str(WORLD)}}]
                  for r in range(WORLD)},
}
BERT = {"layers": 2, "hidden": 16, "heads": 2, "seq": 6, "vocab": 40}
UNO = {"gene": 6, "drug": 7, "fingerprint": 5, "tower": 8, "tower_layers": 1, "hidden": 8,
       "layers": 2}


def _losses(events: list[dict]) -> list[float]:
    return [e["loss"] for e in sorted((e for e in events if e["event"] == "iter"),
                                      key=lambda e: (e["iter"], e["rank"]))]


def test_whole_model_compiled_trains_to_the_eager_losses(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOCTL_INDUCTOR_CACHE", str(tmp_path / "inductor"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    eager = run_local(JOB, tmp_path / "a")
    fused = run_local(JOB | {"fusion": {"mode": "whole"}}, tmp_path / "b")
    want, got = _losses(eager), _losses(fused)
    assert len(got) == len(want) == WORLD * 8
    assert got == pytest.approx(want, rel=1e-4, abs=1e-7)
    assert got[-1] != pytest.approx(got[0], rel=1e-3)  # it trained
    reports = [e for e in fused if e["event"] == "fusion"]
    assert len(reports) == WORLD
    for e in reports:
        assert e["mode"] == "whole" and not e["fallback"]
        assert e["regions"][0][:2] == ["", "compiled"] and e["compile_seconds"] > 0
        assert e["cache_dir"] == str(tmp_path / "inductor")
    assert (tmp_path / "inductor").is_dir()  # inductor's cache went where the run said
    # the ranks share the cache, so they took turns: the second loaded the first's kernels
    cold, warm = sorted((e["compile_seconds"] for e in reports), reverse=True)
    assert warm < cold / 3, (cold, warm)
    assert len({e["checksum"] for e in fused if e["event"] == "done"}) == 1
    # with the plan's own buckets (`disco` plans both): the compiled model's gradients reach
    # the bucket hooks as the eager model's do (the cache is warm: no second compile)
    (tmp_path / "c").mkdir()
    names = [n for n, _ in MLP(**KWARGS).named_parameters()][::-1]  # gradient-ready order
    planned = run_local(JOB | {"fusion": {"mode": "whole"}, "collective": {
        "algorithm": "ring", "bucket_plan": [{"params": names[:1]}, {"params": names[1:]}]}},
        tmp_path / "c")
    assert _losses(planned) == pytest.approx(want, rel=1e-4, abs=1e-7)
    for e in (e for e in planned if e["event"] == "iter"):
        assert [b[0] for b in e["buckets"]] == [0, 1], e  # both buckets, in the plan's order


def _grads(model, inputs) -> list:
    model.zero_grad(set_to_none=True)
    model(*inputs).pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_region_compiled_gives_the_eager_gradients(tmp_path, monkeypatch):
    """CANDLE-Uno's head: a region whose input needs a gradient (the towers' outputs)."""
    monkeypatch.setenv("TOPOCTL_INDUCTOR_CACHE", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    model = CandleUno(**UNO)
    x = [torch.randn(3, UNO[k]) for k in ("gene", "drug", "fingerprint")]
    want = _grads(model, x)
    names = [n for n, _ in model.named_parameters()]
    report = apply_fusion(model, parse_fusion({"mode": "groups", "regions": ["head"]}), x,
                          rank=0)
    assert [r.status for r in report.regions] == ["compiled"]
    assert "forward" in vars(model.head)  # the compiled forward, in place
    assert [n for n, _ in model.named_parameters()] == names  # names kept (buckets use them)
    for g, w in zip(_grads(model, x), want, strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-6)


def _raising_backend(gm, example_inputs):
    raise RuntimeError("no C++ compiler for this graph")


def test_fallbacks_are_visible_and_run_eager(capsys):
    torch.manual_seed(0)
    model = BertEncoder(**BERT)
    ids = torch.randint(0, BERT["vocab"], (3, BERT["seq"]))
    want = _grads(model, [ids])
    report = apply_fusion(model, FusionPlan("groups", ("layers.0", "layers.1")), [ids], rank=0,
                          backend=_raising_backend)
    assert [r.status for r in report.regions] == ["failed", "failed"]
    assert "no C++ compiler" in report.regions[0].reason
    assert "forward" not in vars(model.layers[0])  # the class's eager forward is back
    for g, w in zip(_grads(model, [ids]), want, strict=True):
        assert torch.equal(g, w)
    budget = apply_fusion(model, FusionPlan("whole", ("",), budget_s=0.0), [ids], rank=1)
    assert [(r.status, r.seconds) for r in budget.regions] == [("budget", 0.0)]
    seen = capsys.readouterr()
    assert "region layers.1 runs eager (failed: BackendCompilerFailed" in seen.err
    assert "no C++ compiler for this graph)" in seen.err
    assert "region <whole model> runs eager (budget: budget of 0 s spent" in seen.err
    assert report.event(0)["fallback"] and budget.event(1)["fallback"]
