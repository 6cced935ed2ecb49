"""The job's model as every rank builds it: the factory the plan names, its synthetic inputs,
the DDP wrapping the trainer uses, and the checksum ranks compare after training. Shared by the
data-parallel trainer (`train`), the pipeline stages (`pipeline`) and, through `timing`, the
controller's timing of a lab rank's step."""

from __future__ import annotations

import hashlib
import importlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def load_factory(path: str):
    """The object a job's ``model.factory`` names (``module:attr.path``), imported."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def data_parallel(model, bucket_cap_mb: float):
    """`model` wrapped in DDP as the trainer runs it (the controller times a lab rank's step
    through this same wrapping, `topoctl.graph.ddpstep`). The gradients are views into DDP's
    buckets: DDP then does not copy them back out of the reduced buckets (measured on the
    2-core VM beside 4 co-running ranks, the demo's MLP at batch 48: backward 11.0-11.5 ms of
    CPU against 13.1-13.3 with the copies).

    DDP's construction does not broadcast the parameters (``init_sync=False``): every rank
    builds the same weights from the job's seed, and `check_same_weights` proves it with 32
    bytes per rank instead of the whole model over the fabric (the demo's 16 MB MLP took
    about 5 s to start on its slowest cables)."""
    return DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb,
                                   gradient_as_bucket_view=True, init_sync=False)


def check_same_weights(model) -> None:
    """Raise RuntimeError unless every rank of the default process group holds the same
    parameters as this one (their `checksum`s gathered: 32 bytes per rank)."""
    mine = torch.frombuffer(bytearray(bytes.fromhex(checksum(model))), dtype=torch.uint8)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    differ = [r for r, c in enumerate(every) if not torch.equal(c, mine)]
    if differ:
        raise RuntimeError(f"ranks {differ} built other initial weights than rank "
                           f"{dist.get_rank()}: the model factory is not deterministic for a seed")


def random_inputs(specs: list[dict], batch: int, gen):
    """One batch of `batch` samples of the job's ``model.inputs`` (`specs`), drawn from the
    torch generator `gen`: normal floats, or integers below ``high`` (default 2)."""
    out = []
    for s in specs:
        shape = (batch, *s["shape"])
        if s.get("dtype", "float32").startswith("int"):
            out.append(torch.randint(0, int(s.get("high") or 2), shape, generator=gen))
        else:
            out.append(torch.randn(shape, generator=gen))
    return out


def data_seed(seed: int, rank: int, iteration: int) -> int:
    """The seed of rank `rank`'s synthetic batch at `iteration`: each rank its own shard, and
    a resumed run draws the batches the uninterrupted run would have."""
    return (seed * 1_000_003 + 1000 + rank) * 1_000_003 + iteration


def checksum(model) -> str:
    """SHA-256 of the model's parameters (ranks compare it after training)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()
