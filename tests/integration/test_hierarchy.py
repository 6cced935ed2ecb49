"""The hierarchical AllReduce (`topotrain.collectives.hierarchy`) with real processes over
gloo on loopback, against a flat `dist.all_reduce` of the same random tensors.

One spawn of 8 processes; each layout (hosts x ranks per host, how ranks are numbered on the
hosts, the host ring order, ring or trees across hosts) runs in its own process group of the
ranks it needs (a prefix of the shared store). The DDP hook trains as DDP's own AllReduce does.
"""

from __future__ import annotations

import json
import os
import random
import traceback
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.loopback import free_port, spawn_ranks  # noqa: E402
from topocontract.hierarchy import HierarchyError, parse_hierarchy  # noqa: E402
from topocontract.schedule import TreeSchedule  # noqa: E402
from topotrain.collectives.hierarchy import (  # noqa: E402
    HierarchicalAllReduce,
    register_hierarchy_hook,
)

WORLD = 8
SIZES = [1, 2, 7, 1000, 4099]
# (hosts, ranks per host, numbering, host order, inter-host algorithm): numbering "block"
# gives host j ranks j*k.., "strided" ranks j, j+H, ..; an order that is not a rotation or
# reflection of ascending ranks takes the point-to-point ring
LAYOUTS = [
    (1, 2, "block", None, "ring"),
    (2, 1, "block", None, "ring"),
    (2, 2, "block", None, "ring"),
    (4, 2, "block", None, "ring"),
    (4, 2, "block", [0, 2, 1, 3], "ring"),
    (4, 2, "strided", [3, 1, 0, 2], "ring"),
    (2, 4, "block", None, "ring"),
    (2, 3, "strided", None, "ring"),
    (3, 2, "block", [2, 0, 1], "trees"),
    (4, 2, "strided", [1, 3, 0, 2], "trees"),
    (8, 1, "block", [0, 2, 4, 6, 1, 3, 5, 7], "ring"),
]


def random_schedule(world: int, ntrees: int, seed: int) -> dict:
    """Random spanning trees over `world` hosts."""
    rng = random.Random(seed)
    trees = []
    for t in range(ntrees):
        rest = [r for r in range(world) if r != t % world]
        rng.shuffle(rest)
        placed, parents = [t % world], [None] * world
        for r in rest:
            parents[r] = rng.choice(placed)
            placed.append(r)
        trees.append({"root": t % world, "rate": rng.uniform(0.5, 3), "parents": parents})
    return {"world_size": world, "chunk_bytes": 64, "trees": trees}


def collective_and_processes(hosts: int, k: int, numbering: str, order, inter: str
                             ) -> tuple[dict, dict]:
    """The plan's `job.collective` and `job.processes` for a layout (written by hand until
    the planner renders `hierarchical`)."""
    names = [f"h{j}" for j in range(hosts)]
    procs = {}
    for j, h in enumerate(names):
        ranks = ([j * k + i for i in range(k)] if numbering == "block"
                 else [j + i * hosts for i in range(k)])
        procs[h] = [{"rank": r, "local_rank": i} for i, r in enumerate(ranks)]
    order = [names[j] for j in (order or range(hosts))]
    coll = {"algorithm": inter, "order": order, "hierarchical": {"local_size": k}}
    if inter == "trees":
        coll["schedule"] = random_schedule(hosts, 3, seed=hosts * 10 + k)
    return coll, procs


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def _layout_cases(rank: int, li: int, layout, fails: list[str]) -> int:
    """Every size of one layout on this rank; the cases run."""
    coll, procs = collective_and_processes(*layout)
    h = parse_hierarchy(coll, procs)
    sched = TreeSchedule.model_validate(coll["schedule"]) if "schedule" in coll else None
    ar = HierarchicalAllReduce.create(h, sched)
    if layout[3] in ([0, 2, 1, 3], [3, 1, 0, 2], [0, 2, 4, 6, 1, 3, 5, 7]) and \
            layout[4] == "ring" and ar.native_ring:
        fails.append(f"{layout}: a ring out of rank order ran as the group's own ring")
    n = 0
    for size in SIZES:
        gen = torch.Generator().manual_seed(rank * 7919 + size + li)
        x = torch.randn(size, generator=gen)
        want = x.clone()
        dist.all_reduce(want)
        got = ar(x.clone())
        if not _close(got, want):
            err = (got - want).abs().max().item()
            fails.append(f"{layout} n={size}: max abs error {err}")
        n += 1
    return n


def _ddp_case(rank: int, fails: list[str]) -> None:
    """DDP with the hierarchical hook (4 hosts x 2, out-of-order ring) trains as DDP's own."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    coll, procs = collective_and_processes(4, 2, "block", [0, 2, 1, 3], "ring")

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(13, 17), torch.nn.Tanh(),
                                   torch.nn.Linear(17, 3))

    ref = DDP(make(), bucket_cap_mb=0.0005)
    hooked = DDP(make(), bucket_cap_mb=0.0005)
    state = register_hierarchy_hook(hooked, parse_hierarchy(coll, procs))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, hooked)]
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        xb, yb = torch.randn(8, 13, generator=gen), torch.randn(8, 3, generator=gen)
        for m, opt in zip((ref, hooked), opts, strict=True):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(xb), yb).backward()
            opt.step()
    if len(state.take_timings()) < 2:
        fails.append("the hook reduced fewer than 2 buckets")
    for (name, a), b in zip(ref.named_parameters(), hooked.parameters(), strict=True):
        if not _close(b.detach(), a.detach()):
            fails.append(f"ddp param {name} differs")


def _worker(rank: int, port: int, outdir: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    fails: list[str] = []
    cases = 0
    try:
        base = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0,
                             timeout=timedelta(seconds=120))
        for li, layout in enumerate(LAYOUTS):
            w = layout[0] * layout[1]
            if rank < w:
                dist.init_process_group("gloo", store=dist.PrefixStore(f"l{li}", base),
                                        rank=rank, world_size=w)
                cases += _layout_cases(rank, li, layout, fails)
                if w == 8:
                    # a hierarchy of another world size is refused
                    coll, procs = collective_and_processes(2, 2, "block", None, "ring")
                    try:
                        HierarchicalAllReduce.create(parse_hierarchy(coll, procs))
                        fails.append("a 4-rank hierarchy was accepted by 8 ranks")
                    except HierarchyError:
                        pass
                dist.destroy_process_group()
        dist.init_process_group("gloo", store=dist.PrefixStore("ddp", base), rank=rank,
                                world_size=WORLD)
        _ddp_case(rank, fails)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        fails.append(f"rank {rank} crashed:\n{traceback.format_exc()}")
    Path(outdir, f"{rank}.json").write_text(json.dumps({"fails": fails, "cases": cases}))


@pytest.mark.timeout(300)
def test_hierarchical_allreduce_equals_a_flat_allreduce(tmp_path):
    spawn_ranks(_worker, (free_port(), str(tmp_path)), WORLD)
    reports = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    fails = [f for rep in reports for f in rep["fails"]]
    assert not fails, "\n".join(fails[:20])
    # rank 0 is in every layout
    assert reports[0]["cases"] == len(LAYOUTS) * len(SIZES)
