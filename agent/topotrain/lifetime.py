"""How a rank ends: `os._exit` while every object that owns gloo's threads is still alive.

Destroying a gloo process group (`~ProcessGroupGloo`) joins its worker threads. When that
destructor runs on the main thread from a Python deallocation (DDP's reducer, a process group
dropped by `destroy_process_group`), the main thread holds the GIL while it joins. A worker
that has just run the backward's last AllReduce still owns that work, and the work's
thread-local snapshot (`at::ThreadLocalState`) holds a Python object: the `contextvars`
context autograd stashes for the backward (`torch.autograd.graph._engine_run_backward`).
Dropping it needs the GIL, so the worker waits for the main thread and the main thread for
the worker, forever, after the rank has printed `done` (py-spy: main thread in
`std::thread::join` under `~ProcessGroupGloo` under `~Reducer`, worker `pt_gloo_runloop` in
`gil_scoped_acquire` under `~ThreadLocalState` under `~AsyncAllreduceWork`).

Whether the worker has already dropped the work is scheduling luck, and whether the group dies
at all used to be an accident of import order: `torch._dynamo` imported after the group
exists (DDP's constructor imports it) keeps extra references to the default group, imported
before (a fork server that preloads it) it does not. So a rank holds here what owns gloo's
threads, and `leave` ends the process without running any destructor; the kernel closes the
sockets.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

# what must outlive the rank's code: read by nothing, released only by the process's end
_HELD: list[object] = []


def hold(*objects: object) -> None:
    """Keep `objects` (process groups, the DDP model, hooks that own groups) alive until
    `leave`: none of their destructors runs in this process."""
    _HELD.extend(objects)


def leave(code: int) -> NoReturn:
    """End the rank with exit code `code`: stdout and stderr flushed, then `os._exit`, with
    no interpreter teardown and no destructor of what `hold` keeps (see the module's text)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
