"""A plain torchrun-style DDP script, as `topoctl run` launches it (docs/own-script.md).

Nothing in it is topoctl's: torch.distributed reads RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT from the environment (the plan's `job.processes.<host>[].env`), gloo binds the
rank's training address (the launcher makes it the rank's hostname), and the data comes from
the script's own Dataset and DataLoader, split over the ranks by DistributedSampler. When the
plan synchronises gradients over packed trees, the launcher names the schedule in
$TOPO_TREE_SCHEDULE and the script may register topoctl's DDP hook for it. It runs the same
under torchrun:

    torchrun --nproc-per-node 2 examples/ddp_own_data.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def dataset(samples: int = 1024, features: int = 32, classes: int = 4) -> TensorDataset:
    """The script's own data: points labelled by a fixed random linear map."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def main() -> None:
    dist.init_process_group("gloo")  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial model on every rank
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model = DistributedDataParallel(net)
    if os.environ.get("TOPO_TREE_SCHEDULE"):  # the plan's packed trees
        from topotrain.collectives import register_tree_hook

        hook = register_tree_hook(model)
        print(f"rank {rank}: tree hook over {len(hook.schedule.trees)} tree(s)", flush=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = dataset()
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    for epoch in range(int(os.environ.get("EPOCHS", "2"))):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
    digest = sum(float(p.double().sum()) for p in model.parameters())
    print(f"rank {rank}: parameter sum {digest:.12g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
