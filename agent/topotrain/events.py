"""A rank's events (`start`, `iter`, `done`, ...): one JSON object per line on the event channel.

`topo-agent launch` gives each rank a pipe of its own and names its write end in
$TOPOCTL_EVENT_FD; what the rank prints on stdout or stderr is only ever shown as output, never
read as an event. Run outside a launcher (no such variable), events go to stdout."""

from __future__ import annotations

import json
import os
import sys
import threading

EVENT_FD_ENV = "TOPOCTL_EVENT_FD"  # as topoagent.process.launch sets it
_lock = threading.Lock()
_channel = None


def _open():
    fd = os.environ.get(EVENT_FD_ENV)
    if fd is None or not fd.isdigit():
        return sys.stdout
    return os.fdopen(int(fd), "w", buffering=1, closefd=False)


def emit(**event) -> None:
    """Write one event line (flushed at once: the controller shows progress from it)."""
    global _channel
    with _lock:
        if _channel is None:
            _channel = _open()
        _channel.write(json.dumps(event) + "\n")
        _channel.flush()
