"""The apply's SIGTERM handler stays in the agent's own process (issue 50 item 14): pyroute2's
netns helper is forked (no exec) to open a socket inside the target namespace and is ended by
pyroute2 with SIGTERM; inheriting the apply's handler, a helper still alive at that moment (a
loaded machine) raised "interrupted by signal 15 during apply" in its copy of the agent, which
printed it although the apply succeeded. Real forked pyroute2 helpers, real signals, a real
namespace; the launcher's handlers are checked the same way."""

from __future__ import annotations

import os
import signal
import time

import pytest
from pyroute2.process import ChildProcess

from topoagent.apply import transaction
from topoagent.process import launch
from topoagent.target import Target

pytestmark = pytest.mark.netns


def _slow() -> bytes:
    time.sleep(30)  # alive when its parent stops it, as on a loaded machine
    return b"done"


@pytest.mark.parametrize("guard", ["apply", "launcher", "launcher cleanup"])
def test_a_forked_helper_dies_of_sigterm_instead_of_running_the_handler(guard):
    ctx = {"apply": transaction._term_as_exception, "launcher": launch._stop_on_signals,
           "launcher cleanup": launch._signals_ignored}[guard]
    with ctx():
        proc = ChildProcess(target=_slow, args=[])
        proc.run()
        time.sleep(0.3)  # the helper is in its target
        t0 = time.monotonic()
        proc.stop()  # what pyroute2 does: SIGTERM, then wait
        assert time.monotonic() - t0 < 10
    # killed by the signal's default action: not an exit after running the agent's handler
    assert proc.exitcode == -signal.SIGTERM, proc.exitcode


def test_an_apply_s_netns_helpers_leave_no_interrupted_message(make_netns, capfd):
    """IPRoute in a namespace (the management guard's `ip route get`) under the apply's
    handler, many times: never the message, and the agent's own SIGTERM still interrupts."""
    target = Target(make_netns())
    with transaction._term_as_exception():
        for _ in range(20):
            ipr = target.iproute()
            ipr.close()
        with pytest.raises(transaction.Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert "interrupted by signal" not in capfd.readouterr().err
