"""A data-parallel rank's whole training step timed as the lab's trainer runs it: through DDP.

DDP's autograd hooks run on the rank's own thread and copy every gradient into its bucket
(and, unless the gradients are views into the buckets, the reduced bucket back out): compute
the rank pays whatever the collective is, which the bare model's step leaves out. Measured
on the 2-core VM (the demo's MLP at batch 48, 4 copies co-running, CPU of the
thread): forward 4.5, backward 13.7, step 2.3 ms through DDP with its default copies against
3.8 / 8.6 / 2.3 ms for the bare model; the lab's ranks (mesh5, 5 ranks, tree AllReduce) spent
5.0 / 14.2 / 2.5 ms on their main threads, and the simulator, given the bare model's times,
predicted the rest of the iteration beside the AllReduce at 37 ms where it took 55.

    fwd, bwd, step = ddp_step_times(model, inputs, bucket_bytes=4_000_000, threads=1)

The step runs in a child process forked from the timing's fork server (`graph.forks`: torch
already imported): a process group of one (gloo over an in-memory store; the planner's own
process never joins one) and a communication hook that hands each bucket back as it is, since
the collective is costed on its own (strategies); the model is wrapped as the trainer wraps it
(`topotrain.train.data_parallel`) and `graph.steptime.whole_step_times` times it.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at runtime
import gc
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from topoctl.graph.forks import FORKS
from topoctl.graph.steptime import whole_step_times
from topotrain.timing import data_parallel

__all__ = ["ddp_step_timer", "ddp_step_times"]

TIMEOUT_S = 300.0  # the group and a few steps beside the copies, the fork server starting


def ddp_step_times(model: nn.Module, inputs: tuple[torch.Tensor, ...], bucket_bytes: int,
                   threads: int = 1, warmup: int = 2, repeats: int = 5
                   ) -> tuple[float, float, float]:
    """(forward, backward, SGD step) seconds of one training step of `model` wrapped in DDP
    (buckets of `bucket_bytes`, `threads` torch threads), timed in a child process as
    `whole_step_times` times the bare model. RuntimeError with the child's error when it
    fails."""
    with ddp_step_timer(model, inputs, bucket_bytes, threads, warmup, repeats) as time_step:
        return time_step()


@contextmanager
def ddp_step_timer(model: nn.Module, inputs: tuple[torch.Tensor, ...], bucket_bytes: int,
                   threads: int = 1, warmup: int = 2, repeats: int = 5
                   ) -> Iterator[Callable[[], tuple[float, float, float]]]:
    """`ddp_step_times` in two halves: the child is set up on entry (model loaded, process
    group, DDP wrapper: over a second of CPU, most of the child's work), and the function the
    context yields times the step (warm-up and repeats) when called. A caller timing the step
    beside co-running copies (`graph.cost`) starts them in between, so they do not burn the
    cores through the set-up, which is not timed."""
    with tempfile.TemporaryDirectory(prefix="tp-ddpstep-") as tmp:
        path = Path(tmp, "step.pt")
        torch.save({"model": model, "inputs": tuple(inputs), "bucket_bytes": int(bucket_bytes),
                    "threads": int(threads), "warmup": warmup, "repeats": repeats}, path)
        conn, theirs = FORKS.Pipe()
        child = FORKS.Process(target=_child, args=(str(path), theirs), daemon=True)
        child.start()
        theirs.close()
        try:
            ok, answer = _reply(conn, child)  # set up: (True, "set up") or the error
            if not ok:
                raise RuntimeError(f"timing the DDP step failed: {answer}")

            def time_step() -> tuple[float, float, float]:
                conn.send("go")
                ok, answer = _reply(conn, child)
                if not ok:
                    raise RuntimeError(f"timing the DDP step failed: {answer}")
                fwd, bwd, step = answer
                return float(fwd), float(bwd), float(step)

            yield time_step
        finally:
            conn.close()  # a child still waiting for "go" sees EOF and ends
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join()


def _reply(conn: Connection, child: BaseProcess) -> tuple[bool, object]:
    """The child's (ok, times or error text); RuntimeError when it hangs or dies silently."""
    if not conn.poll(TIMEOUT_S):
        raise RuntimeError(f"timing the DDP step took over {TIMEOUT_S:.0f} s")
    try:
        return conn.recv()
    except EOFError:
        child.join(5)
        raise RuntimeError(f"timing the DDP step failed: its process exited {child.exitcode}"
                           ) from None


def _bucket_as_is(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket unreduced (the collective is not what is timed)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _child(path: str, conn: Connection) -> None:
    """The child: set up the step of the request in file `path` and say so, time it when told
    to go; send (True, times) or (False, the error) on `conn`."""
    gc.freeze()  # as a rank: what the fork server loaded is out of the collector's reach
    try:
        req = torch.load(path, weights_only=False)
        torch.set_num_threads(req["threads"])
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            ddp = data_parallel(req["model"], req["bucket_bytes"] / 2**20)  # as the trainer
            ddp.register_comm_hook(None, _bucket_as_is)
            conn.send((True, "set up"))
            try:
                conn.recv()  # "go"
            except EOFError:
                return  # the caller gave up before timing
            times = whole_step_times(ddp, req["inputs"], req["warmup"], req["repeats"])
        finally:
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the caller raises it with the step's context
        conn.send((False, f"{type(e).__name__}: {e}"[-500:]))
        return
    conn.send((True, list(times)))
