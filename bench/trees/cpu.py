"""CPU seconds per tree AllReduce per rank: the lock-step executor vs the legacy threaded one.

    .venv/bin/python -m bench.trees.cpu [--bytes 16672800] [--iters 3] [--json OUT]
        [--labs plans/hetero8-cluster.yaml plans/tworack8-cluster.yaml]

8 ranks (one per host of the cluster file) on this machine, gloo over loopback (no shaping:
the network is not the limit, so the figure is the runtime's own CPU cost), the trees the
planner packs for the file's cables. New: ``topotrain.collectives.tree_allreduce`` with the
chunk the cost model picks (``topoctl.collective.trees.pipeline``); legacy:
``bench.trees.runtime_legacy`` (two threads per tree, one blocking op per 16 KiB chunk).
Per method: warm-up, then ``--iters`` AllReduces between barriers; CPU = user + system time of
the rank's process (all its threads) per AllReduce, mean over ranks, median over iterations;
wall time likewise. Checks both against ``dist.all_reduce``. Reports the load average: the
figures are only comparable on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.common.trees import LEGACY_CHUNK, cluster_cables, trees_for
from topotrain.collectives import TreeSchedule, tree_allreduce

GRAD = 16_672_800  # bytes: the MLP demo job's 15.9 MiB of gradients


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _worker(rank: int, world: int, port: int, out: str, jobs: list, nbytes: int,
            iters: int) -> None:
    from bench.trees.runtime_legacy import legacy_tree_allreduce

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    res = {}
    base = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank))
    want = base.clone()
    dist.all_reduce(want)
    for name, sched_doc, legacy in jobs:
        sched = TreeSchedule.model_validate(sched_doc)
        fn = legacy_tree_allreduce if legacy else tree_allreduce
        x = base.clone()
        fn(x, sched)  # warm-up: connections, program compilation
        ok = bool(torch.allclose(x, want, rtol=1e-4, atol=1e-4))
        cpus, walls = [], []
        for _ in range(iters):
            x = base.clone()
            dist.barrier()
            c0, t0 = _cpu(), time.perf_counter()
            fn(x, sched)
            c1 = _cpu()
            dist.barrier()
            walls.append(time.perf_counter() - t0)
            gathered = [0.0] * world
            dist.all_gather_object(gathered, c1 - c0)
            cpus.append(sum(gathered) / world)
        res[name] = {"cpu_s": statistics.median(cpus), "wall_s": statistics.median(walls),
                     "cpu_all": cpus, "wall_all": walls, "correct": ok}
    if rank == 0:
        Path(out, "result.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labs", nargs="+", default=["plans/hetero8-cluster.yaml",
                                                  "plans/tworack8-cluster.yaml"])
    ap.add_argument("--bytes", type=int, default=GRAD)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    jobs, info = [], {}
    world = None
    for lab in args.labs:
        hosts, links, mtu = cluster_cables(lab)
        world = world or len(hosts)
        if len(hosts) != world:
            raise SystemExit("all labs need the same number of hosts")
        plan, _, sched, pred = trees_for(hosts, links, mtu, args.bytes, loopback=True)
        _, _, legacy, _ = trees_for(hosts, links, mtu, args.bytes, chunk_bytes=LEGACY_CHUNK)
        label = Path(lab).stem.replace("-cluster", "")
        jobs.append((f"{label} new", sched.dump(), False))
        jobs.append((f"{label} legacy", legacy.dump(), True))
        info[label] = {"trees": len(plan.trees), "chunk_bytes": sched.chunk_bytes,
                       "chunks": pred.chunks, "predicted_cpu_s": pred.cpu_s}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tp-treescpu-") as tmp:
        mp.spawn(_worker, args=(world, port, tmp, jobs, args.bytes, args.iters), nprocs=world,
                 join=True)
        res = json.loads(Path(tmp, "result.json").read_text())
    print(f"{world} ranks on this machine ({os.cpu_count()} cores), gloo on loopback, "
          f"{args.bytes / 2**20:.1f} MiB, medians of {args.iters}; load average before "
          f"{load0[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print("| lab | executor | chunk | CPU s per AllReduce per rank | wall s | correct |")
    print("|---|---|---|---|---|---|")
    for name, r in res.items():
        label, kind = name.rsplit(" ", 1)
        chunk = info[label]["chunk_bytes"] if kind == "new" else LEGACY_CHUNK
        print(f"| {label} | {kind} | {chunk} B | {r['cpu_s']:.3f} | {r['wall_s']:.3f} | "
              f"{r['correct']} |")
    for label, i in info.items():
        print(f"{label}: {i['trees']} trees, {i['chunks']} chunks per tree; the cost model's "
              f"CPU part (all ranks on {os.cpu_count()} cores, loopback: no cable emulation) "
              f"{i['predicted_cpu_s']:.3f} s = {i['predicted_cpu_s'] * os.cpu_count() / world:.3f} "
              "s per rank")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": res, "info": info,
                                               "load": [load0, os.getloadavg()]}, indent=1))
    return 0 if all(r["correct"] for r in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
