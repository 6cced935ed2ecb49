"""Tree-schedule AllReduce and its DDP hook with real processes over gloo on loopback.

One spawn of 8 processes; subgroups give every world size 2..8 (odd ones included). Each
case compares `tree_allreduce` with `dist.all_reduce` on the same random inputs.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.loopback import free_port, spawn_ranks  # noqa: E402
from tests.treegen import random_trees  # noqa: E402
from topotrain.collectives import (  # noqa: E402
    ScheduleMismatch,
    TreeSchedule,
    register_tree_hook,
    tree_allreduce,
)

WORLD = 8
# (elements, chunk bytes): one element; chunks of 1 and 3 elements; 100- and 250-element chunks that
# do not divide the partitions; one chunk per partition
CASES = [(1, 4), (2, 4), (7, 12), (1000, 400), (4099, 1000), (4099, 1 << 20)]


def random_schedule(world: int, ntrees: int, seed: int) -> TreeSchedule:
    """Random spanning trees (random attachment order), distinct roots where possible."""
    return TreeSchedule.model_validate(
        {"world_size": world, "chunk_bytes": 64, "trees": random_trees(world, ntrees, seed)}
    )


def planned_schedule() -> dict:
    """The planner's schedule for the two-rack 8-host mesh (16 trees)."""
    import itertools

    from topoctl.collective.trees.pack import plan_trees
    from topoctl.collective.trees.schedule import plan_to_schedule
    from topoctl.fabric.capgraph import build_capgraph

    pairs = itertools.combinations(range(8), 2)
    links = [(a, b, 10.0 if a // 4 == b // 4 else 1.0) for a, b in pairs]
    g = build_capgraph(links)
    return plan_to_schedule(plan_trees(g, max_trees=16), chunk_bytes=256).dump()


def _check(results, name, got, want, exact=False):
    ok = torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    if not ok:
        err = (got.double() - want.double()).abs().max().item()
        results.append(f"{name}: max abs error {err}")


def _worker(rank: int, port: int, outdir: str, planned: dict) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    fails: list[str] = []
    counts = {"cases": 0}
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
        )
        groups = {w: dist.new_group(list(range(w))) for w in range(2, WORLD)}
        groups[WORLD] = None
        for w in range(2, WORLD + 1):
            if rank >= w:
                continue
            grp = groups[w]
            for ntrees in (1, 3, w + 1):
                sched = random_schedule(w, ntrees, seed=100 * w + ntrees)
                for size, cb in CASES:
                    sched.chunk_bytes = cb
                    gen = torch.Generator().manual_seed(rank * 7919 + size + cb + ntrees)
                    x = torch.randn(size, generator=gen)
                    want = x.clone()
                    dist.all_reduce(want, group=grp)
                    got = tree_allreduce(x.clone(), sched, grp)
                    _check(fails, f"w={w} trees={ntrees} n={size} chunk={cb}", got, want)
                    counts["cases"] += 1
                # more pipeline chunks than elements: most chunks are empty
                for size in (3, 5):
                    x = torch.randn(size, generator=torch.Generator().manual_seed(rank + size))
                    want = x.clone()
                    dist.all_reduce(want, group=grp)
                    got = tree_allreduce(x.clone(), sched, grp, chunks=16)
                    _check(fails, f"w={w} trees={ntrees} n={size} chunks=16", got, want)
            # integers are exact; a 2-D non-contiguous view is reduced in place
            xi = torch.arange(30, dtype=torch.int64).reshape(5, 6).t() * (rank + 1)
            wi = xi.clone()
            dist.all_reduce(wi, group=grp)
            tree_allreduce(xi, random_schedule(w, 2, seed=w), grp)
            _check(fails, f"w={w} int64 non-contiguous", xi, wi, exact=True)
            # a schedule for another world size is refused, naming both sizes
            try:
                tree_allreduce(torch.ones(3), random_schedule(w + 1, 1, 0), grp)
                fails.append(f"w={w}: schedule for {w + 1} ranks was accepted")
            except ScheduleMismatch as exc:
                if f"world_size={w + 1}" not in str(exc) or f"runs {w} ranks" not in str(exc):
                    fails.append(f"w={w}: unclear refusal: {exc}")
        # the planner's 16-tree schedule on 8 ranks
        sched = TreeSchedule.model_validate(planned)
        for size in (1, 333, 100_003):
            x = torch.randn(size, generator=torch.Generator().manual_seed(rank + size))
            want = x.clone()
            dist.all_reduce(want)
            _check(fails, f"planned n={size}", tree_allreduce(x.clone(), sched), want)
            # receives posted strictly step by step, one step ahead, and all steps ahead
            for ahead in (0, 1, 10_000):
                got = tree_allreduce(x.clone(), sched, chunks=8, lookahead=ahead)
                _check(fails, f"planned n={size} lookahead={ahead}", got, want)
        _ddp_case(rank, groups, fails)
    except Exception:  # noqa: BLE001 - reported to the parent
        fails.append(f"rank {rank} crashed:\n{traceback.format_exc()}")
    Path(outdir, f"{rank}.json").write_text(json.dumps({"fails": fails, **counts}))
    if dist.is_initialized():
        dist.destroy_process_group()


def _ddp_case(rank: int, groups, fails: list[str]) -> None:
    """DDP with the hook trains exactly like DDP with its default all_reduce (world 5)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    w = 5
    if rank >= w:
        return
    grp = groups[w]

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(13, 17), torch.nn.Tanh(), torch.nn.Linear(17, 3))

    ref = DDP(make(), process_group=grp, bucket_cap_mb=0.0005)
    hooked = DDP(make(), process_group=grp, bucket_cap_mb=0.0005)
    try:
        register_tree_hook(hooked, random_schedule(w - 1, 2, 1))
        fails.append("hook accepted a schedule for 4 ranks in a 5-rank job")
    except ScheduleMismatch:
        pass
    register_tree_hook(hooked, random_schedule(w, 3, 5))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, hooked)]
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        xb, yb = torch.randn(8, 13, generator=gen), torch.randn(8, 3, generator=gen)
        for m, opt in zip((ref, hooked), opts, strict=True):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(xb), yb).backward()
            opt.step()
    for (name, a), b in zip(ref.named_parameters(), hooked.parameters(), strict=True):
        _check(fails, f"ddp param {name}", b.detach(), a.detach())


@pytest.mark.timeout(300)
def test_tree_allreduce_matches_all_reduce_world_2_to_8(tmp_path):
    planned = planned_schedule()
    spawn_ranks(_worker, (free_port(), str(tmp_path), planned), WORLD)
    reports = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    fails = [f for rep in reports for f in rep["fails"]]
    assert not fails, "\n".join(fails[:20])
    # rank 0 is in every world size: 7 sizes x 3 tree counts x sizes x chunks
    assert reports[0]["cases"] == 7 * 3 * len(CASES)
