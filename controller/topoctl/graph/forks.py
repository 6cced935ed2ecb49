"""One `multiprocessing` fork server for the timing's helper processes, torch imported once.

Timing a lab rank's step starts helper processes: the co-running copies of the step
(`graph.corun`) and the DDP step in a process group of its own (`graph.ddpstep`). Started as
fresh interpreters each imported torch (about 1.4 s of CPU on the 2-core VM, paid eight times
per timing and slower still beside the busy copies); forked from this server they start at once.
The server starts on first use and lives as long as the process that started it.

    p = FORKS.Process(target=fn, args=(...)); p.start()
"""

from __future__ import annotations

import multiprocessing

__all__ = ["FORKS"]

FORKS = multiprocessing.get_context("forkserver")
# what the children run imports these; without a list the server would import the caller's
# __main__ instead (a CLI, pytest, a benchmark). torch._dynamo: the first optimizer a process
# builds imports it (~0.9 s of CPU), which every co-running copy and DDP step paid again
FORKS.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "topotrain.timing",
                              "topoctl.graph.steptime"])
