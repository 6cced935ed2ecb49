"""The confirmation's probe of the management path (`topo-agent confirm-probe`, then `confirm
--probe -`): without it, with an altered payload or with one back too late, an apply made with
--confirm-within is not kept; too late reverts at once. Real namespace, real agent processes,
the host read back with iproute2/tc (tests.netns.host_dump). The same probe over a lab's real
sshd, through a path shaped to 1 kbit/s: tests/e2e/test_faults.py."""

from __future__ import annotations

import json
import time

from tests.integration.test_agent import Host, dump, full_state, host  # noqa: F401
from tests.integration.test_confirm import (  # noqa: F401
    alive,
    confirm_host,
    consistent,
    past_deadline,
    record,
    wait_for,
)
from tests.integration.test_crash import new_state

WINDOW = "20"  # seconds: room for the steps below on a loaded machine


def test_confirm_needs_the_probe_back_whole(confirm_host: Host):  # noqa: F811
    h = confirm_host
    assert h.apply(full_state()).returncode == 0
    r = h.apply(new_state(), "--confirm-within", WINDOW, "--no-probe")
    assert r.returncode == 0, r.stderr
    new = dump(h.ns)
    # a small confirmation alone is no longer enough
    bare = h.agent("confirm")
    assert bare.returncode == 1, bare.stderr
    assert "needs a probe of the management path" in bare.stderr
    assert "Traceback" not in bare.stderr
    no_probe_yet = h.agent("confirm", "--probe", "-", stdin="x" * 1000)
    assert no_probe_yet.returncode == 1 and "no probe was sent" in no_probe_yet.stderr
    sent = h.agent("--json", "confirm-probe")
    assert sent.returncode == 0, sent.stderr
    doc = json.loads(sent.stdout)
    payload = doc["payload"]
    assert len(payload) == doc["bytes"] == 512 * 1024
    assert len(set(payload)) > 60  # random base64, not a run of one byte
    altered = payload[:-1] + ("A" if payload[-1] != "A" else "B")
    bad = h.agent("confirm", "--probe", "-", stdin=altered)
    assert bad.returncode == 1 and "the probe came back altered" in bad.stderr, bad.stderr
    assert record(h)["state"] == "pending" and dump(h.ns) == new
    good = h.agent("--json", "confirm", "--probe", "-", stdin=payload + "\n")
    assert good.returncode == 0, good.stderr
    out = json.loads(good.stdout)
    assert out["confirmed"] and out["probe"]["bytes"] == 512 * 1024
    assert 0 < out["probe"]["seconds"] < 15
    rec = record(h)
    assert rec["state"] == "confirmed" and rec["probe"]["seconds"] == out["probe"]["seconds"]
    assert wait_for(lambda: not alive(rec["watchdog"]), 5)
    assert dump(h.ns) == new
    consistent(h, history=3)
    # a probe is too small to mean anything below 256 KiB: refused as usage
    small = h.agent("confirm-probe", "--bytes", "1000")
    assert small.returncode == 1 and "--bytes" in small.stderr


def test_a_probe_back_too_late_reverts_at_once(confirm_host: Host):  # noqa: F811
    h = confirm_host
    assert h.apply(full_state()).returncode == 0
    old = dump(h.ns)
    assert h.apply(new_state(), "--confirm-within", WINDOW, "--no-probe").returncode == 0
    sent = h.agent("--json", "confirm-probe", "--within", "1")
    payload = json.loads(sent.stdout)["payload"]
    time.sleep(1.5)  # a starved path: the bytes come back after the probe's deadline
    late = h.agent("confirm", "--probe", "-", stdin=payload)
    assert late.returncode == 1, late.stderr
    assert "the management path is too slow: the probe (524288 bytes each way) took" in \
        late.stderr and "the apply was reverted" in late.stderr, late.stderr
    # reverted now, long before the confirmation deadline
    assert time.time() < record(h)["deadline"]
    assert record(h)["state"] == "reverted"
    assert dump(h.ns) == old
    consistent(h, history=2)
    again = h.agent("confirm", "--probe", "-", stdin=payload)
    assert again.returncode == 1 and "too late: the apply was reverted" in again.stderr


def test_no_probe_keeps_the_apply_at_the_console(confirm_host: Host):  # noqa: F811
    h = confirm_host
    assert h.apply(full_state()).returncode == 0
    assert h.apply(new_state(), "--confirm-within", "5", "--no-probe").returncode == 0
    new = dump(h.ns)
    r = h.agent("confirm", "--no-probe")
    assert r.returncode == 0 and "confirmed: the apply stays" in r.stdout, r.stderr
    past_deadline(record(h))
    assert dump(h.ns) == new and record(h)["state"] == "confirmed"
