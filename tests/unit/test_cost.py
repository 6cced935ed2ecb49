"""Per-op cost: roofline against its formula, measurement on this CPU, the profile cache."""

from __future__ import annotations

import pytest
import torch

from topoctl.catalog import build_model, example_inputs
from topoctl.graph import cache, steptime
from topoctl.graph.capture import capture_catalog
from topoctl.graph.cost import OpCost, measure_costs, roofline_costs, scale_costs, totals
from topoctl.graph.devices import DEVICES, Device


def test_roofline_compute_bound_and_memory_bound_ops():
    dev = Device("X", {"float32": 1e12}, 1e11, launch=1e-6, efficiency=0.5)
    g = capture_catalog("mlp", {"layers": 1, "hidden": 4096, "features": 4096}, 512)
    c = roofline_costs(g, dev)
    big = g.by_name()["net_0"]  # 4096x4096 linear on 512 rows: compute bound
    assert c["net_0"].fwd == pytest.approx(1e-6 + big.flops / 0.5e12)
    relu = g.by_name()["net_1"]  # elementwise: memory bound
    moved = relu.in_bytes + relu.out_bytes
    assert c["net_1"].fwd == pytest.approx(1e-6 + moved / 0.5e11)
    assert c["net_1"].bwd == pytest.approx(1e-6 + 2 * moved / 0.5e11)
    assert all(c[o.name] == OpCost(0.0, 0.0) for o in g.ops if o.is_view)


def test_faster_device_is_faster_and_fp16_uses_tensor_cores():
    g = capture_catalog("bert", {"layers": 2, "hidden": 256, "heads": 4}, 8)
    v100, h100 = totals(roofline_costs(g, DEVICES["V100"])), totals(
        roofline_costs(g, DEVICES["H100"]))
    assert h100[0] < v100[0] and h100[1] < v100[1]
    g16 = capture_catalog("bert", {"layers": 2, "hidden": 256, "heads": 4}, 8, "float16")
    assert totals(roofline_costs(g16, DEVICES["A100"], "float16"))[0] < \
        totals(roofline_costs(g, DEVICES["A100"]))[0]


def test_measured_costs_are_positive_and_heavier_ops_take_longer():
    torch.manual_seed(0)
    params = {"layers": 1, "hidden": 512, "features": 512}
    m = build_model("mlp", params)
    x = example_inputs("mlp", params, 64)
    g = capture_catalog("mlp", params, 64)
    c = measure_costs(m, x, g, warmup=1, repeats=5)
    assert c["net_0"].fwd > 0 and c["net_0"].bwd == pytest.approx(2 * c["net_0"].fwd)
    assert c["net_0"].fwd > c["net_1"].fwd  # 512x512 matmul vs relu
    assert scale_costs(c, 2.0)["net_0"].fwd == pytest.approx(2 * c["net_0"].fwd)


def test_profile_cache_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOCTL_CACHE", str(tmp_path))
    k = cache.profile_key("mlp", {"layers": 1}, 8, "float32")
    assert k != cache.profile_key("mlp", {"layers": 2}, 8, "float32")
    assert cache.load(k) is None
    cache.store(k, {"a": OpCost(1.0, 2.0)})
    assert cache.load(k) == {"a": OpCost(1.0, 2.0)}


def test_timed_steps_runs_until_enough_time_is_timed():
    """Short steps are repeated past `repeats` until MIN_TIMED_S of them are timed (a noisy
    machine's median needs the time), long ones only `repeats` times; warm-up runs untimed."""
    calls = []

    def step(seconds):
        def run():
            calls.append(seconds)
            return (seconds / 2, seconds / 2, 0.0)
        return run

    short = steptime.MIN_TIMED_S / 20
    assert steptime.timed_steps(step(short), warmup=2, repeats=5) == (short / 2, short / 2, 0.0)
    assert len(calls) - 2 == 20
    calls.clear()
    steptime.timed_steps(step(steptime.MIN_TIMED_S), warmup=1, repeats=3)
    assert len(calls) == 4


def test_a_stage_timing_counts_whole_steps_towards_the_timed_seconds(monkeypatch):
    """`stage_step_times` hands `timed_steps` whole passes (all micro-batches), so it stops
    after MIN_TIMED_S of real stepping, and reports per micro-batch figures."""
    seen: list[tuple[float, float]] = []  # (sum of the parts, the step's own CPU seconds)
    real = steptime.timed_steps

    def recording(step, warmup, repeats):
        def timed():
            t0 = steptime.step_clock()()
            parts = step()
            seen.append((sum(parts), steptime.step_clock()() - t0))
            return parts
        return real(timed, warmup, repeats)

    monkeypatch.setattr(steptime, "timed_steps", recording)
    torch.manual_seed(0)
    params = {"layers": 2, "hidden": 256, "features": 256}
    m = build_model("mlp", params)
    x = example_inputs("mlp", params, 32)
    fwd, bwd, _ = steptime.stage_step_times(m, tuple(x), microbatches=4, warmup=1, repeats=3)
    parts, whole = map(sum, zip(*seen, strict=True))
    assert parts == pytest.approx(whole, rel=0.3)  # a quarter with per micro-batch parts
    assert 0 < fwd < parts / len(seen) / 4
