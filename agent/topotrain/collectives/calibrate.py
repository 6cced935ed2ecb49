"""CPU cost calibration of the tree-schedule runtime, cached per machine.

    python -m topotrain.collectives.calibrate [--force] [--json]

A short micro-benchmark (a few seconds) of what the lock-step executor
(:mod:`topotrain.collectives.program`) spends CPU on, measured as CPU time (all threads of the
process, gloo's included), not wall time:

* ``per_message_s``: CPU seconds per point-to-point operation (a posted send or receive of a
  small message, waited for) between 2 local processes over gloo on loopback, including the
  executor's Python work per message;
* ``wire_bytes_per_s``: bytes sent + received per CPU second by one process over the same
  connection (kernel copies, gloo), with the per-message part removed;
* ``reduce_bytes_per_s`` / ``copy_bytes_per_s``: bytes per CPU second of ``torch.add(out=)`` and
  ``Tensor.copy_`` on 16 MiB float32 blocks (one thread, as the ranks run);
* ``per_message_shared_s`` / ``wire_bytes_per_s_shared``: the same with ``4 * cores`` processes
  in pairs at once (as the lab's ranks share the cores: every blocking wait is a context
  switch);
* ``per_piece_s``: CPU seconds of the executor's work per piece of a packed message (a tensor
  slice and a small ``torch.add(out=)``/``copy_``: torch's per-call overhead);
* ``cores``: CPUs this process may run on;
* ``tcp_congestion``: the TCP congestion control the pairs ran under.

Run as root, the processes run in a throwaway network namespace (``tpc-<pid>``, loopback only)
whose congestion control is :data:`TCP_CONGESTION`, the one the lab's hosts use, whatever the
machine's own is: the runtime's CPU cost depends on it (on the Intel Xeon VM,
loopback moved 7.7-8.5 GB per CPU second with cubic and 4.8-5.3 with BBR, whose pacing without
the fq qdisc runs on timers), also on a kernel whose allowed list leaves it out
(:mod:`topoagent.congestion`). Without root the machine's own is used, and recorded.

Cached as JSON under ``$TOPOCTL_CACHE/runtime/`` (default ``~/.cache/topoctl/runtime``), one file
per machine key (CPU model, core count, torch version), like the planner's op-time cache; the
planner reads it through :func:`load_calibration` (no torch needed for that). ``--force``
measures again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from topoagent.congestion import CONGESTION_SYSCTL, set_congestion_control
from topoagent.target import Target, drop_netns_etc, give_files_only_names

__all__ = ["TCP_CONGESTION", "calibration_path", "ensure_calibration", "load_calibration",
           "machine_key", "measure"]

VERSION = 5  # 5: the pairs get cubic also where the kernel restricts namespaces' choice
TCP_CONGESTION = "cubic"
"""The congestion control the runtime is calibrated under: the lab hosts' own
(``topoctl.lab.lab.HOST_TCP_CONGESTION`` is this one)."""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _torch_version() -> str:
    try:
        return version("torch")
    except Exception:  # noqa: BLE001 - no torch: the key still identifies the machine
        return "none"


def machine_key() -> str:
    """What the calibration depends on: CPU model, cores, torch version, machine type."""
    ident = json.dumps({"cpu": _cpu_model(), "cores": _cores(), "torch": _torch_version(),
                        "machine": platform.machine(), "v": VERSION}, sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def calibration_path() -> Path:
    """Where this machine's calibration is cached ($TOPOCTL_CACHE/runtime/<machine>.json)."""
    base = Path(os.environ.get("TOPOCTL_CACHE", Path.home() / ".cache" / "topoctl"))
    return base / "runtime" / f"{machine_key()}.json"


def load_calibration() -> dict[str, Any] | None:
    """The cached calibration of this machine, or None (never measures; no torch import)."""
    try:
        data = json.loads(calibration_path().read_text())
    except (OSError, ValueError):
        return None
    keys = ("per_message_s", "wire_bytes_per_s", "reduce_bytes_per_s", "copy_bytes_per_s",
            "cores")
    if not isinstance(data, dict) or any(not isinstance(data.get(k), (int, float))
                                         or data[k] <= 0 for k in keys):
        return None
    return data


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@contextmanager
def _scratch_netns() -> Iterator[str | None]:
    """A throwaway network namespace with only ``lo`` (up) and :data:`TCP_CONGESTION`; None
    (use the current one) without root or ``ip``. Removed on exit."""
    name = f"tpc-{os.getpid()}"
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "add", name], capture_output=True,
                                           check=False).returncode != 0:
        yield None
        return
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True,
                       check=True)
        # on a kernel without it the namespace keeps the machine's, which the pairs record
        set_congestion_control([name], TCP_CONGESTION)
        give_files_only_names(name)  # no DNS in here: c10d's name lookups must not wait for it
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        drop_netns_etc(name)


def _worker(rank: int, port: int, out: str, rounds: int, small: int, big: int,
            big_bytes: int, world: int = 2, netns: str | None = None) -> None:
    # before gloo starts its threads, which then share the namespace
    Target(netns=netns).enter()

    import torch  # torch only in the measuring processes: load_calibration stays import-light
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    pg = dist.distributed_c10d._get_default_group()
    peer = rank ^ 1  # pairs (0, 1), (2, 3), ... exchange at the same time

    def exchange(nbytes: int, steps: int) -> float:
        half = max(1, nbytes // 4)
        flat = torch.zeros(2 * half)
        for _ in range(3):  # warm-up (connections, allocations)
            ws = [pg.send([flat[:half]], peer, 7), pg.recv([flat[half:]], peer, 7)]
            for w in ws:
                w.wait()
        dist.barrier()
        c0 = _cpu()
        for _ in range(steps):  # what the executor does per message: slice, post, wait
            ws = [pg.send([flat[0:half]], peer, 7), pg.recv([flat[half : 2 * half]], peer, 7)]
            for w in ws:
                w.wait()
        return _cpu() - c0

    # medians of `rounds` rounds: the machine may be shared
    per_msg = statistics.median(exchange(4, small) / (2 * small) for _ in range(rounds))
    wire = statistics.median(
        2 * big * big_bytes / max(exchange(big_bytes, big) - 2 * big * per_msg, 1e-9)
        for _ in range(rounds))
    res: dict[str, float] = {"per_message_s": per_msg, "wire_bytes_per_s": wire}
    if rank == 0 and world == 2:  # 16 MiB blocks: gradients do not fit in the caches either
        a, b = torch.ones(1 << 22), torch.ones(1 << 22)
        nb = a.numel() * 4

        def timed(fn) -> float:
            c0 = _cpu()
            for _ in range(4):
                fn()
            return 4 * nb / max(_cpu() - c0, 1e-9)

        res["reduce_bytes_per_s"] = statistics.median(
            timed(lambda: torch.add(a, b, out=a)) for _ in range(rounds))
        res["copy_bytes_per_s"] = statistics.median(timed(lambda: a.copy_(b))
                                                    for _ in range(rounds))

        def pieces() -> float:  # the executor's work per piece: slice + add/copy/cat
            n, ln = 2000, 256
            c0 = _cpu()
            for i in range(n):
                o = (i * ln) % (a.numel() - ln)
                dst = a[o : o + ln]
                if i % 2:
                    torch.add(dst, b[o : o + ln], out=dst)
                else:
                    dst.copy_(b[o : o + ln])
            return (_cpu() - c0) / n

        res["per_piece_s"] = statistics.median(pieces() for _ in range(rounds))
    res["tcp_congestion"] = Target().read_sysctl(CONGESTION_SYSCTL) or "?"
    Path(out, f"{rank}.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def measure(rounds: int = 5, small: int = 500, big: int = 8, big_bytes: int = 4 << 20,
            context: BaseContext | None = None) -> dict[str, Any]:
    """Run the micro-benchmark (2 processes over gloo on loopback; medians of ``rounds``) and
    return its figures; the two processes' per-message and wire figures are averaged.
    ``context``: the multiprocessing context that starts the measuring processes (default
    ``spawn``: fresh interpreters; a caller that keeps a fork server with torch imported passes
    it, and the ten processes start without importing torch each)."""
    ctx = context or multiprocessing.get_context("spawn")
    with _scratch_netns() as netns:
        return _measure(rounds, small, big, big_bytes, netns, ctx)


def _run_workers(ctx: BaseContext, nprocs: int, args: tuple) -> None:
    """`_worker(rank, *args)` in `nprocs` processes of `ctx`, waited for; an error names the
    ranks that failed."""
    procs = [ctx.Process(target=_worker, args=(rank, *args), daemon=True)
             for rank in range(nprocs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
    if failed:
        raise RuntimeError(f"calibration processes failed (rank: exit code): {failed}")


def _measure(rounds: int, small: int, big: int, big_bytes: int, netns: str | None,
             ctx: BaseContext) -> dict[str, Any]:
    # the rendezvous port is free in a fresh namespace; in the current one, ask the kernel
    port = 29517 if netns else _free_port()
    with tempfile.TemporaryDirectory(prefix="tp-calibrate-") as tmp:
        _run_workers(ctx, 2, (port, tmp, rounds, small, big, big_bytes, 2, netns))
        r0 = json.loads(Path(tmp, "0.json").read_text())
        r1 = json.loads(Path(tmp, "1.json").read_text())
    # oversubscribed: 4 ranks per core in pairs (the lab: 8 ranks on 2 cores); blocking
    # waits then cost context switches
    shared = 4 * _cores()
    port = port + 1 if netns else _free_port()
    with tempfile.TemporaryDirectory(prefix="tp-calibrate-") as tmp:
        _run_workers(ctx, shared, (port, tmp, rounds, small // 4, big, big_bytes, shared, netns))
        rs = [json.loads(Path(tmp, f"{r}.json").read_text()) for r in range(shared)]
    per_shared = statistics.median(r["per_message_s"] for r in rs)
    wire_shared = statistics.median(r["wire_bytes_per_s"] for r in rs)
    return {
        "version": VERSION,
        "key": machine_key(),
        "machine": {"cpu": _cpu_model(), "torch": _torch_version()},
        "cores": _cores(),
        "per_message_s": float(f"{(r0['per_message_s'] + r1['per_message_s']) / 2:.4g}"),
        "wire_bytes_per_s": float(f"{(r0['wire_bytes_per_s'] + r1['wire_bytes_per_s']) / 2:.4g}"),
        "shared_ranks": shared,
        "per_message_shared_s": float(f"{per_shared:.4g}"),
        "wire_bytes_per_s_shared": float(f"{wire_shared:.4g}"),
        "reduce_bytes_per_s": float(f"{r0['reduce_bytes_per_s']:.4g}"),
        "copy_bytes_per_s": float(f"{r0['copy_bytes_per_s']:.4g}"),
        "per_piece_s": float(f"{r0['per_piece_s']:.4g}"),
        "tcp_congestion": r0["tcp_congestion"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_calibration(force: bool = False, context: BaseContext | None = None
                       ) -> dict[str, Any]:
    """The cached calibration; measured (and stored) first if missing or ``force``
    (``context``: as for :func:`measure`)."""
    if not force:
        cached = load_calibration()
        if cached is not None:
            return cached
    data = measure(context=context)
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return load_calibration() or data


def main(argv: list[str] | None = None) -> int:
    """`python -m topotrain.collectives.calibrate`: measure (or show the cached) costs."""
    ap = argparse.ArgumentParser(prog="python -m topotrain.collectives.calibrate",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--force", action="store_true", help="measure even if cached")
    ap.add_argument("--json", action="store_true", help="print the JSON only")
    args = ap.parse_args(argv)
    data = ensure_calibration(force=args.force)
    if args.json:
        print(json.dumps(data, sort_keys=True))
        return 0
    print(f"{calibration_path()}")
    print(f"  per message      {data['per_message_s'] * 1e6:.1f} us CPU")
    print(f"  wire (loopback)  {data['wire_bytes_per_s'] / 1e9:.2f} GB per CPU second")
    if "per_message_shared_s" in data:
        print(f"  {data['shared_ranks']} ranks sharing the cores: per message "
              f"{data['per_message_shared_s'] * 1e6:.1f} us, wire "
              f"{data['wire_bytes_per_s_shared'] / 1e9:.2f} GB per CPU second")
    print(f"  reduction        {data['reduce_bytes_per_s'] / 1e9:.2f} GB per CPU second")
    print(f"  copy             {data['copy_bytes_per_s'] / 1e9:.2f} GB per CPU second")
    print(f"  per piece        {data.get('per_piece_s', 0) * 1e6:.1f} us CPU")
    print(f"  cores            {data['cores']}")
    print(f"  TCP              {data.get('tcp_congestion', '?')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
