"""One rank of the AllReduce benchmark (``python -m topotrain.collectives.benchworker``,
started by ``topoctl bench allreduce`` inside a lab host's namespace).

Measures, in one run and in this order: gloo's default ``all_reduce``, a ring in a given order
(reduce-scatter + all-gather over p2p) and the tree schedule
(``topotrain.collectives.tree_allreduce``). Rank 0 prints one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist

from topocontract.trees import LOOKAHEAD
from topotrain.collectives import load_schedule, tree_allreduce


def ring_allreduce(x: torch.Tensor, order: list[int]) -> torch.Tensor:
    """Ring AllReduce along ``order`` (order[i] sends to order[i+1]): N-1 reduce-scatter and
    N-1 all-gather steps of M/N each."""
    n = len(order)
    pos = order.index(dist.get_rank())
    nxt, prv = order[(pos + 1) % n], order[(pos - 1) % n]
    segs = list(torch.tensor_split(x, n))
    tmp = torch.empty_like(segs[0])
    for s in range(n - 1):
        send_i, recv_i = (pos - s) % n, (pos - s - 1) % n
        buf = tmp[: segs[recv_i].numel()]
        reqs = [dist.isend(segs[send_i], nxt, tag=7), dist.irecv(buf, prv, tag=7)]
        for r in reqs:
            r.wait()
        segs[recv_i].add_(buf)
    for s in range(n - 1):
        send_i, recv_i = (pos + 1 - s) % n, (pos - s) % n
        reqs = [dist.isend(segs[send_i], nxt, tag=8), dist.irecv(segs[recv_i], prv, tag=8)]
        for r in reqs:
            r.wait()
    return x


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _sys_busy() -> tuple[float, float]:
    with open("/proc/stat") as f:
        vals = [float(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def main() -> None:
    """Run one benchmark rank (--rank, --world, --master) and print its timings as JSON lines."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True, help="host:port of the TCP store")
    ap.add_argument("--bytes", type=int, default=8 << 20)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--ring-iters", type=int, default=2)
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--ring-order", default="")
    ap.add_argument("--trees-only", action="store_true", help="skip the baselines (tuning)")
    ap.add_argument("--no-ring", action="store_true", help="skip the ring baseline")
    ap.add_argument("--lookahead", type=int, default=LOOKAHEAD,
                    help="steps whose receives the tree runtime posts early")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world)
    sched = load_schedule(args.schedule)
    order = [int(r) for r in args.ring_order.split(",")] if args.ring_order else list(
        range(args.world))
    n = args.bytes // 4
    base = torch.full((n,), float(args.rank + 1))
    expect = args.world * (args.world + 1) / 2
    methods = {
        "gloo all_reduce (default)": (lambda x: dist.all_reduce(x), args.ring_iters),
        "ring, best order": (lambda x: ring_allreduce(x, order), args.ring_iters),
        "packed trees": (lambda x: tree_allreduce(x, sched, lookahead=args.lookahead),
                         args.iters),
    }
    if args.trees_only:
        methods = {"packed trees": methods["packed trees"]}
    elif args.no_ring:
        del methods["ring, best order"]
    out = {}
    for name, (fn, iters) in methods.items():
        x = base[:4096].clone()
        fn(x)  # warm-up on a small tensor (connections, threads)
        ok = bool(torch.allclose(x, torch.full_like(x, expect)))
        times, cpu = [], 0.0
        busy0 = _sys_busy()
        for _ in range(iters):
            x = base.clone()
            dist.barrier()
            c0, t0 = _cpu(), time.perf_counter()
            fn(x)
            dist.barrier()
            times.append(time.perf_counter() - t0)
            cpu += _cpu() - c0
        busy1 = _sys_busy()
        ok = ok and bool(torch.allclose(x, torch.full_like(x, expect)))
        cpus = [0.0] * args.world
        dist.all_gather_object(cpus, cpu)
        out[name] = {"seconds": times, "median": statistics.median(times), "correct": ok,
                     "bench_cores": sum(cpus) / sum(times),
                     "machine_busy": (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1e-9)}
    if args.rank == 0:
        print(json.dumps({"bytes": args.bytes, "world": args.world, "results": out,
                          "pid": os.getpid()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
