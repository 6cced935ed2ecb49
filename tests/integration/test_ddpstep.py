"""`graph.ddpstep.ddp_step_times`: a data-parallel rank's step timed through DDP in a child
process (a process group of one), as the lab's trainer runs it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from topoctl.graph.cost import whole_step_times
from topoctl.graph.ddpstep import ddp_step_times


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
