"""Signal handlers that act only in the process that installed them.

A Python signal handler is inherited by a child made with fork() and no exec: pyroute2's netns
helper (`pyroute2.process.ChildProcess`, forked to open a socket inside a namespace) ran the
apply's SIGTERM handler when pyroute2 ended it with SIGTERM, and that handler raised
"interrupted by signal 15 during apply" inside the helper, whose copy of the agent's stack then
reported it as the agent's own (issue 50 item 14: a successful apply printed it on a loaded
machine, where the helper is still alive when its parent stops it). `only_here(handler)` wraps
a handler so that in any other process the signal's default action happens instead: the
helper dies of SIGTERM as it would without the agent, silently."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]


def only_here(handler: Handler) -> Handler:
    """`handler` for this process; in a forked child the signal's default action."""
    owner = os.getpid()

    def handle(signum: int, frame: FrameType | None) -> Any:
        if os.getpid() != owner:  # a forked child (pyroute2's netns helper): die as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return None
        return handler(signum, frame)
    return handle
