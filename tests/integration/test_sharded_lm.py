"""Tensor parallelism, FSDP and their combination train the decoder LM to the losses of one
process: one spawn of 4 ranks over gloo, 20 steps per layout, every step's loss against the
same model trained alone on the same global batch.

Layouts: DTensor tensor parallelism of 2 (two independent pairs on the same data), uneven
tensor parallelism 3:1 (explicit split sizes), FSDP2 over 4, tensor parallelism 2 x FSDP 2,
and tensor parallelism 2 x plain data parallelism 2."""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.loopback import free_port, spawn_ranks  # noqa: E402
from topoctl.catalog.lm import DecoderLM  # noqa: E402
from topotrain.sharded import (  # noqa: E402
    average_gradients,
    shard_lm,
    split_sizes,
    uneven_tensor_parallel,
)

WORLD, STEPS, BATCH = 4, 20, 8
SIZE = {"layers": 2, "hidden": 32, "heads": 4, "seq": 8, "vocab": 64}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return DecoderLM(**SIZE)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, SIZE["vocab"], (BATCH, SIZE["seq"]), generator=g)
        out.append((ids, (ids * 7 + 3) % SIZE["vocab"]))  # a rule the model can learn
    return out


def loss_of(m, x, y) -> torch.Tensor:
    logits = m(x)
    if hasattr(logits, "full_tensor"):
        logits = logits.full_tensor()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, SIZE["vocab"]), y.reshape(-1))


def reference() -> list[float]:
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    out = []
    for x, y in batches():
        opt.zero_grad()
        loss = loss_of(m, x, y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def train(m, dp: int, dp_index: int, after_backward=None) -> list[float]:
    """20 steps on dp shard `dp_index` of each global batch; the global loss per step."""
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    out = []
    per = BATCH // dp
    for x, y in batches():
        xs, ys = x[dp_index * per:(dp_index + 1) * per], y[dp_index * per:(dp_index + 1) * per]
        opt.zero_grad()
        loss = loss_of(m, xs, ys)
        loss.backward()
        if after_backward:
            after_backward(m)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        out.append(total.item() / WORLD)
    return out


def layouts(rank: int) -> dict[str, list[float]]:
    got = {}
    m, _ = shard_lm(model(), dp=2, tp=2, fsdp=False)
    got["tp2"] = train(m, dp=1, dp_index=0)  # both pairs on the whole batch, no gradient sync
    pair = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    got["tp2-uneven-3:1"] = train(uneven_tensor_parallel(model(), [3, 1], pair), dp=1,
                                  dp_index=0)
    m, _ = shard_lm(model(), dp=4, tp=1, fsdp=True)
    got["fsdp4"] = train(m, dp=4, dp_index=rank)
    m, _ = shard_lm(model(), dp=2, tp=2, fsdp=True)
    got["tp2xfsdp2"] = train(m, dp=2, dp_index=rank // 2)
    m, mesh = shard_lm(model(), dp=2, tp=2, fsdp=False)
    dp_group = mesh["dp"].get_group()
    got["tp2xdp2"] = train(m, dp=2, dp_index=rank // 2,
                           after_backward=lambda mm: average_gradients(mm, dp_group))
    return got


def _worker(rank: int, port: int, outdir: str) -> None:
    torch.set_num_threads(1)
    result: dict = {}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD, timeout=timedelta(seconds=240))
        result = layouts(rank)
    except Exception:  # noqa: BLE001 - reported to the parent
        result = {"crash": traceback.format_exc()}
    Path(outdir, f"{rank}.json").write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()


def test_split_sizes_follow_the_weights_in_whole_units():
    assert split_sizes(32, [3, 1], 8) == [24, 8]
    assert split_sizes(128, [1, 1, 1, 1]) == [32, 32, 32, 32]
    assert split_sizes(10, [5, 1, 1]) == [7, 2, 1]  # largest remainder
    with pytest.raises(ValueError):
        split_sizes(16, [1, 1, 1], 8)


@pytest.mark.timeout(600)
def test_every_layout_trains_to_the_losses_of_one_process(tmp_path):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    want = reference()
    spawn_ranks(_worker, (free_port(), str(tmp_path)), WORLD)
    reports = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    crashes = [r["crash"] for r in reports if "crash" in r]
    assert not crashes, crashes[0]
    assert want[-1] < want[0] * 0.9  # it learns
    for name, got in reports[0].items():
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5), name
