"""SSH keepalives with a verdict, like OpenSSH's ServerAliveInterval / ServerAliveCountMax.

paramiko's own `Transport.set_keepalive` only sends packets and never notices that nobody
answers, so a host cut off while its agent runs (its replies blackholed, its link down) kept an
agent call waiting for the whole command timeout (120 s). `Keepalive` asks the server for an
answer (`keepalive@openssh.com` with want-reply; sshd answers every global request, with a
failure for unknown ones, which is as good a sign of life) every `interval` seconds while a call
is in flight; when one stays unanswered for `interval * count` seconds it closes the connection,
which ends the blocked read at once, and `lost` says why. Only public paramiko API is used.
"""

from __future__ import annotations

import threading
import time

import paramiko

REQUEST = "keepalive@openssh.com"


class Keepalive:
    """Watch one SSH connection while an agent call runs (a context manager); `lost` is the
    reason when the server stopped answering and the connection was closed."""

    def __init__(self, transport: paramiko.Transport, interval: float = 2.0, count: int = 3):
        self.transport = transport
        self.interval = interval
        self.count = count
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ssh-keepalive", daemon=True)

    def __enter__(self) -> Keepalive:
        if self.interval > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _ask(self, answered: threading.Event) -> None:
        try:  # blocks until the answer comes or the connection closes
            self.transport.global_request(REQUEST, wait=True)
        except (paramiko.SSHException, OSError, EOFError):
            return  # the connection is gone: the agent call sees that by itself
        if self.transport.is_active():
            answered.set()

    def _run(self) -> None:
        limit = self.interval * self.count
        while not self._stop.wait(self.interval):
            if not self.transport.is_active():
                return
            answered = threading.Event()
            # one request in flight at a time, asked from its own thread: global_request has no
            # timeout of its own
            threading.Thread(target=self._ask, args=(answered,), name="ssh-keepalive-ask",
                             daemon=True).start()
            t0 = time.monotonic()
            while not answered.wait(0.05):  # short: the call's end must not wait
                if self._stop.is_set() or not self.transport.is_active():
                    return
                if time.monotonic() - t0 >= limit:
                    self.lost = (f"no answer from its sshd for {limit:g} s ({self.count} "
                                 f"keepalives {self.interval:g} s apart): the host is "
                                 "unreachable")
                    self.transport.close()  # the blocked read or channel open ends now
                    return
