"""MSCCL programs computed by the reference executor with real processes over gloo.

One spawn of 12 processes; subgroups give the world sizes of the cases (2..12). Each program
goes through its XML text, is checked against the executor's limits and must sum random
tensors exactly like `dist.all_reduce`: rings in a random order, rings on two channels, random
packed trees, hierarchical programs (hosts of k ranks: reduce-scatter, a ring per shard,
all-gather), the planner's 16-tree schedule, and every program `topoctl export nccl` writes for
the example plans (the checked-in plans/*-plan.yaml, and a trees plan of mesh4 planned here).
"""

from __future__ import annotations

import json
import os
import random
import traceback
from pathlib import Path

import pytest
import yaml

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.integration.test_collectives import (  # noqa: E402
    planned_schedule,
    random_schedule,
)
from tests.loopback import free_port, spawn_ranks  # noqa: E402
from topocontract.msccl import check, from_xml, to_xml  # noqa: E402
from topoctl.msccl.hierarchical import hierarchical_allreduce  # noqa: E402
from topoctl.msccl.ring import ring_allreduce  # noqa: E402
from topoctl.msccl.trees import trees_allreduce  # noqa: E402
from topotrain.collectives.msccl import run_allreduce  # noqa: E402

WORLD = 12
PLANS = Path(__file__).resolve().parents[2] / "plans"
SIZES = (1, 7, 1000)


def trees_plan(cluster: str, tmp: Path) -> Path:
    """The mlp job planned with `trees` on an example cluster (roofline costs)."""
    from topoctl.cli import main

    spec = yaml.safe_load((PLANS / "mlp-job.yaml").read_text()) | {"strategies": ["trees"]}
    job = tmp / "mlp-trees-job.yaml"
    job.write_text(yaml.safe_dump(spec))
    out = tmp / f"mlp-{cluster}-trees-plan.yaml"
    assert main(["plan", str(PLANS / f"{cluster}-cluster.yaml"), str(job), "-o", str(out),
                 "--no-cache"]) == 0
    return out


def exported(tmp: Path) -> dict[int, dict[str, str]]:
    """World size -> plan name -> the program `topoctl export nccl` wrote (every host's copy
    the same)."""
    from topoctl.cli import main

    plans = sorted(PLANS.glob("*-plan.yaml")) + [trees_plan("mesh4", tmp)]
    out: dict[int, dict[str, str]] = {}
    for plan in plans:
        d = tmp / plan.stem
        assert main(["export", "nccl", str(plan), "-o", str(d)]) == 0
        files = sorted(d.glob("*/msccl/*.xml"))
        texts = {f.read_text() for f in files}
        assert len(files) == len(list(d.glob("*/topo.xml"))) and len(texts) == 1, plan
        xml = texts.pop()
        out.setdefault(from_xml(xml).ngpus, {})[plan.stem] = xml
    assert any("trees" in name for cases in out.values() for name in cases)
    return out


def programs(tmp: Path) -> dict[int, dict[str, str]]:
    """World size -> case name -> program XML (built and checked in the parent)."""
    out = exported(tmp)
    for w in (2, 3, 5, 8):
        order = list(range(w))
        random.Random(w).shuffle(order)
        cases = {"ring": ring_allreduce(order), "ring2": ring_allreduce(order, channels=2)}
        for ntrees, nchunks in ((1, 4), (3, 16), (w + 1, 5)):
            sched = random_schedule(w, ntrees, seed=100 * w + ntrees)
            cases[f"trees{ntrees}x{nchunks}"] = trees_allreduce(
                [(t.parents, t.rate) for t in sched.trees], nchunks)
        if w == 8:
            sched = planned_schedule()
            cases["planned"] = trees_allreduce(
                [(t["parents"], t["rate"]) for t in sched["trees"]], 64)
        for k in (2, 4, w):  # hosts of k ranks, ranks shuffled over them
            if w % k == 0 and f"hier{w // k}x{k}" not in cases:
                ranks = list(range(w))
                random.Random(k).shuffle(ranks)
                cases[f"hier{w // k}x{k}"] = hierarchical_allreduce(
                    [ranks[i:i + k] for i in range(0, w, k)])
        for name, prog in cases.items():
            assert check(prog) == [], (w, name, check(prog))
        out.setdefault(w, {}).update({name: to_xml(p) for name, p in cases.items()})
    for cases in out.values():
        for name, xml in cases.items():
            assert check(from_xml(xml)) == [], (name, check(from_xml(xml)))
    return out


def _worker(rank: int, port: int, outdir: str, names: dict) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    fails: list[str] = []
    cases = 0
    try:
        from datetime import timedelta
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD, timeout=timedelta(seconds=240))
        groups = {w: dist.new_group(list(range(w))) for w in range(2, WORLD)}
        groups[WORLD] = None
        for w in sorted(names):
            if rank >= w:
                continue
            for name in names[w]:
                prog = from_xml(Path(outdir, f"{w}-{name}.xml").read_text())
                for size in SIZES:
                    gen = torch.Generator().manual_seed(rank * 7919 + size)
                    x = torch.randint(-1000, 1000, (size,), generator=gen).to(torch.float64)
                    want = x.clone()
                    dist.all_reduce(want, group=groups[w])
                    got = run_allreduce(prog, x.clone(), groups[w])
                    if not torch.equal(got, want):
                        fails.append(f"w={w} {name} n={size}: "
                                     f"{(got - want).abs().max().item()} off")
                    cases += 1
    except Exception:  # noqa: BLE001 - reported to the parent
        fails.append(f"rank {rank} crashed:\n{traceback.format_exc()}")
    Path(outdir, f"{rank}.json").write_text(json.dumps({"fails": fails, "cases": cases}))
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.timeout(600)
def test_programs_compute_the_allreduce_world_2_to_8(tmp_path):
    progs = programs(tmp_path)
    for w, cases in progs.items():
        for name, xml in cases.items():
            (tmp_path / f"{w}-{name}.xml").write_text(xml)
    names = {w: sorted(cases) for w, cases in progs.items()}
    spawn_ranks(_worker, (free_port(), str(tmp_path), names), WORLD)
    reports = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    fails = [f for rep in reports for f in rep["fails"]]
    assert not fails, "\n".join(fails[:20])
    assert reports[0]["cases"] == sum(len(p) for p in progs.values()) * len(SIZES)
