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

Each copy is a child process (``python -m topoctl.graph.corun FILE``) that loads the pickled
model and inputs, runs training steps (one torch thread, loss ``mean(out^2)``, SGD) until its
stdin closes, and says ``ready`` after two warm-up steps; the context waits for every copy to
be ready, and stops and reaps them on exit, also on error.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

__all__ = ["co_running"]

READY_TIMEOUT_S = 120.0  # torch's import and the model's first steps, on a busy machine


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
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs: list[subprocess.Popen] = []
        try:
            for _ in range(copies):
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "topoctl.graph.corun", str(path)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, env=env))
            deadline = time.monotonic() + READY_TIMEOUT_S
            for p in procs:
                # "ready", or EOF when the copy died; nothing by the deadline: it hangs
                ready, _, _ = select.select([p.stdout], [], [],
                                            max(0.0, deadline - time.monotonic()))
                line = p.stdout.readline().strip() if ready else ""
                if line != "ready":
                    err = p.stderr.read() if p.poll() is not None else (
                        f"not ready after {READY_TIMEOUT_S:.0f} s")
                    raise RuntimeError(f"a co-running copy of the training step did not start: "
                                       f"{line or err.strip()[-500:] or 'no output'}")
            yield
        finally:
            for p in procs:
                if p.stdin:
                    p.stdin.close()  # the copies stop at their next step
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                for f in (p.stdout, p.stderr):
                    if f:
                        f.close()


def _run(path: str) -> int:
    """The child: training steps until stdin closes."""
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
            print("ready", flush=True)
        if i >= 1 and select.select([sys.stdin], [], [], 0)[0]:
            return 0  # stdin closed (EOF is readable)
    return 0


if __name__ == "__main__":
    sys.exit(_run(sys.argv[1]))
