"""The planner's gradient buckets are the ones torch's DDP builds from the plan's
``bucket_cap_mb``: the tree strategy fuses buckets (``sync.fusion``) and predicts each bucket's
AllReduce, so a different bucketing in the real DDP would make the prediction wrong.

Real torch: a one-rank gloo group, DDP around the plan's model, a comm hook that records the
bucket sizes of the second iteration (DDP rebuilds its buckets after the first, from the order
gradients became ready)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel as DDP

from topoctl.planner import make_plan
from topoctl.spec.cluster_load import load_cluster
from topoctl.spec.job import parse_job
from topotrain.train import load_factory

PLANS = Path(__file__).resolve().parents[2] / "plans"


def _ddp_bucket_bytes(model_spec: dict, cap_mb: float, tmp_path: Path) -> list[int]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        torch.manual_seed(0)
        model = load_factory(model_spec["factory"])(**model_spec["kwargs"])
        ddp = DDP(model, bucket_cap_mb=cap_mb)
        seen: list[int] = []

        def hook(_state, bucket):
            seen.append(bucket.buffer().numel() * bucket.buffer().element_size())
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, hook)
        shape = model_spec["inputs"][0]["shape"]
        for _ in range(2):
            seen.clear()
            ddp(torch.randn(4, *shape)).sum().backward()
        return list(seen)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("bucket", ["4MB", "8MB", "100MB"])
def test_planned_buckets_are_ddps(bucket, tmp_path):
    job = yaml.safe_load((PLANS / "mlp-job.yaml").read_text())
    job["strategies"] = ["trees"]
    job["sync"] = {"bucket": bucket, "fusion": "fixed"}
    doc, _, _ = make_plan(load_cluster(PLANS / "hetero8-cluster.yaml"), parse_job(job),
                          use_cache=False)
    spec = doc["job"]
    planned = spec["collective"]["buckets"]
    measured = _ddp_bucket_bytes(spec["model"], spec["bucket_cap_mb"], tmp_path)
    assert measured == planned, f"cap {bucket}: DDP made {measured}, the plan has {planned}"
