"""Co-running copies of a training step: time a lab rank as it runs beside the others.

In the lab every rank runs on this machine's few cores, and a rank's forward and backward take
more CPU time beside the others than alone: caches, memory bandwidth and the scheduler are
shared. Measured on the 2-core VM, the demo's MLP at batch 48: 18.3 ms of CPU per
step alone, 21.0 ms with 8 copies at once (+15%); at batch 77 with 5 copies +10%. The
simulator shares the cores among the ranks (``Network.cpu_pool``) but takes each rank's CPU
time as timed, so the step is timed with the other ranks' work running beside it
(`co_running`).

    with co_running(model, inputs, copies=7):
        whole = whole_step_times(model, inputs)

Each copy is a process forked from the timing's fork server (`graph.forks`: torch imported
once). A copy loads the pickled model and inputs, runs training steps (one torch thread, loss
``mean(out^2)``, SGD) until the parent says stop, and says ``ready`` after two warm-up steps,
then waits for ``go``; the context waits for every copy to be ready, tells them all to go (a
copy ready early does not burn a core while the others start), and stops and reaps them on
exit, also on error.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch
from torch import nn

from topoctl.graph.forks import FORKS

__all__ = ["co_running"]

READY_TIMEOUT_S = 120.0  # the fork server starting (torch imported), the first steps


@contextmanager
def co_running(model: nn.Module, inputs: tuple[torch.Tensor, ...], copies: int
               ) -> Iterator[None]:
    """`copies` processes run training steps of `model` on `inputs` for as long as the
    context lasts (none when `copies` < 1). RuntimeError when a copy fails to start."""
    if copies < 1:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="tp-corun-") as tmp:
        path = Path(tmp, "step.pt")
        torch.save({"model": model, "inputs": tuple(inputs)}, path)
        procs: list[tuple[BaseProcess, Connection]] = []
        try:
            for _ in range(copies):
                mine, theirs = FORKS.Pipe()
                p = FORKS.Process(target=_run, args=(str(path), theirs), daemon=True)
                p.start()
                theirs.close()
                procs.append((p, mine))
            _wait_ready(procs)
            for _, conn in procs:  # all warm: now all step at once
                conn.send("go")
            yield
        finally:
            _stop(procs)


def _wait_ready(procs: list[tuple[BaseProcess, Connection]]) -> None:
    """Return once every copy said ``ready``; RuntimeError when one died or hangs."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    for p, conn in procs:
        # "ready", or EOF when the copy died; nothing by the deadline: it hangs
        line = ""
        if wait([conn], max(0.0, deadline - time.monotonic())):
            try:
                line = conn.recv()
            except EOFError:
                p.join(1)
                line = f"it died (exit code {p.exitcode})"
        if line != "ready":
            raise RuntimeError("a co-running copy of the training step did not start: "
                               f"{line or f'not ready after {READY_TIMEOUT_S:.0f} s'}")


def _stop(procs: list[tuple[BaseProcess, Connection]]) -> None:
    """Tell every copy to stop (they stop at their next step) and reap them."""
    for _, conn in procs:
        conn.close()  # the copy sees EOF
    for p, _ in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()


def _run(path: str, conn: Connection) -> None:
    """A copy: training steps until the parent closes `conn`."""
    torch.set_num_threads(1)
    doc = torch.load(path, weights_only=False)  # our own file, written by the parent
    model, inputs = doc["model"], doc["inputs"]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for i in range(1 << 62):
        model.zero_grad(set_to_none=True)
        out = model(*inputs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        out.float().pow(2).mean().backward()
        opt.step()
        if i == 1:
            conn.send("ready")
            try:  # idle until every copy is warm (one ready early would burn a core meanwhile)
                conn.recv()
            except EOFError:
                return  # the parent gave up (another copy failed to start)
        if i >= 1 and conn.poll():
            return  # the parent closed its end (EOF is readable)
