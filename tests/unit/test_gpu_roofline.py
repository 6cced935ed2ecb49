"""bench.planner.gpu_roofline: each catalog model's ops timed on a device against the roofline.
Its code runs here on the CPU (against the roofline's `CPU` type); the GPU case needs CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bench.planner.gpu_roofline import kind_errors, main  # noqa: E402


def test_the_check_times_every_op_kind_on_the_cpu(capsys):
    rows = kind_errors("mlp", {"hidden": 64, "layers": 2}, 4, "cpu", "CPU", "float32", 1)
    kinds = {k for k, *_ in rows}
    assert "linear" in kinds or any("linear" in k for k in kinds), kinds
    assert all(n > 0 and measured > 0 and roof > 0 for _, n, measured, roof in rows)
    assert main(["--device", "cpu", "--gpu-type", "CPU", "--models", "mlp", "--batch", "4",
                 "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "against the CPU roofline" in out and "\n  all " in out


def test_the_check_on_a_gpu(capsys):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine: the GPU roofline check needs one")
    assert main(["--models", "mlp", "bert", "--repeats", "3"]) == 0
    assert "against the A100 roofline" in capsys.readouterr().out
