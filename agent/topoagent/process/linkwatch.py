"""Watch the carrier of the fabric interfaces that carry training (`topo-agent launch`).

A cable that fails (unplugged, `topoctl lab cut`) takes the carrier of the NIC at each end
away at once, while the ranks' TCP connections only stall: gloo would notice after its
timeout (120 s). The launcher therefore polls the interfaces its job spec names (`watch`) with
one rtnetlink link dump per poll (microseconds, no pyroute2) and reports the first one that
is down, so the controller can name the cable within a second.

An interface counts as down when it lacks IFF_UP or IFF_LOWER_UP (no carrier) or is gone, in
two polls in a row (one glitchy dump is not a failed cable)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from topoagent.observe import nldump

IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
POLL_S = 0.2  # seconds between dumps: detection within ~2 polls
CONFIRM = 2  # consecutive polls an interface must be seen down


@dataclass(frozen=True)
class LinkDown:
    """A watched interface found down: its name, why, and the wall-clock time it was first
    seen down (time.time(), comparable across hosts with synchronised clocks)."""

    interface: str
    reason: str  # "no carrier", "administratively down", "missing"
    at: float


def link_states(sock: socket.socket) -> dict[str, str]:
    """Every link of the socket's namespace -> "up", "no carrier" or "administratively down"."""
    out = {}
    for link in nldump.dump_links(sock):
        if not link.flags & IFF_UP:
            out[link.name] = "administratively down"
        elif not link.flags & IFF_LOWER_UP:
            out[link.name] = "no carrier"
        else:
            out[link.name] = "up"
    return out


def down_now(states: dict[str, str], watched: list[str]) -> dict[str, str]:
    """The watched interfaces that are not up in `states`, with the reason."""
    return {i: states.get(i, "missing") for i in watched if states.get(i) != "up"}


class LinkWatch:
    """Poll `watched` in the namespace of `sock` from a daemon thread; call `on_down` once,
    with the first interface seen down in CONFIRM consecutive polls, then stop."""

    def __init__(self, sock: socket.socket, watched: list[str],
                 on_down: Callable[[LinkDown], None], poll: float = POLL_S):
        self.sock, self.watched, self.on_down, self.poll = sock, list(watched), on_down, poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="linkwatch", daemon=True)

    def check(self) -> LinkDown | None:
        """One immediate look: the first watched interface that is down now (None: all up)."""
        down = down_now(link_states(self.sock), self.watched)
        if not down:
            return None
        name = sorted(down)[0]
        return LinkDown(name, down[name], time.time())

    def start(self) -> LinkWatch:
        """Start polling; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and close the socket."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.sock.close()

    def _run(self) -> None:
        seen: dict[str, tuple[int, float]] = {}  # interface -> (polls seen down, first time)
        while not self._stop.wait(self.poll):
            try:
                down = down_now(link_states(self.sock), self.watched)
            except OSError:  # the namespace went away: nothing left to watch
                return
            now = time.time()
            seen = {i: (seen.get(i, (0, now))[0] + 1, seen.get(i, (0, now))[1]) for i in down}
            for name in sorted(seen):
                n, first = seen[name]
                if n >= CONFIRM:
                    self.on_down(LinkDown(name, down[name], first))
                    return
