"""`graph.ddpstep.ddp_step_times`: a data-parallel rank's step timed through DDP in a child
process (a process group of one), as the lab's trainer runs it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from topoctl.graph.ddpstep import ddp_step_times
from topoctl.graph.steptime import whole_step_times


class _Unused(nn.Module):
    """A layer whose parameters never get a gradient: DDP (without find_unused_parameters)
    refuses the second step, the bare model does not care."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_three_positive_times_and_the_planner_joins_no_group():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    fwd, bwd, step = ddp_step_times(model, (torch.randn(32, 64),), bucket_bytes=1 << 20)
    assert fwd > 0 and bwd > 0 and step > 0
    assert not dist.is_initialized()  # the group of one lived in the child


def test_the_step_really_runs_through_ddp():
    model, inputs = _Unused(), (torch.randn(4, 16),)
    assert min(whole_step_times(model, inputs)) >= 0  # the bare model trains
    with pytest.raises(RuntimeError, match="(?s)timing the DDP step failed.*did not receive grad"):
        ddp_step_times(model, inputs, bucket_bytes=1 << 20)


_VIEWS = """
import torch, torch.distributed as dist
from topotrain.train import data_parallel
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 4))
ddp = data_parallel(model, 1.0)
spans = []
def hook(state, bucket):
    buf = bucket.buffer()
    spans.append((buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()))
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut
ddp.register_comm_hook(None, hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(3):  # DDP makes the gradients views after its first iteration
    spans.clear()
    opt.zero_grad(set_to_none=True)
    ddp(torch.randn(8, 32)).pow(2).mean().backward()
    opt.step()
inside = [any(a <= p.grad.data_ptr() < b for a, b in spans) for p in model.parameters()]
print(all(inside), len(inside))
dist.destroy_process_group()
"""


def test_the_trainer_s_gradients_are_views_into_ddp_s_buckets():
    # no copy out of the reduced buckets: every gradient lives in a bucket's memory
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _VIEWS], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["True", "4"]
