"""apply.yml's confirmation as rollout events: the probe's two steps (censored: their results
hold the payload) say nothing, the task after them says what became of the confirmation."""

from __future__ import annotations

from topoctl.rollout.ansible import event_of


def ev(kind: str, task: str, **res) -> dict:
    return {"event": kind, "event_data": {"host": "h3", "task": task, "res": res,
                                          "duration": 0.5}}


def facts(state: str, detail: str = "") -> dict:
    return ev("runner_on_ok", "Note the confirmation", ansible_facts={
        "topo_confirmation": state, "topo_confirmation_detail": detail})


def test_confirmation_events():
    censored = {"censored": "the output has been hidden"}
    assert event_of(ev("runner_on_ok", "Probe the management path", **censored)) is None
    assert event_of(ev("runner_on_failed", "Confirm with the probe sent back",
                       **censored)) is None
    e = event_of(ev("runner_on_unreachable", "Probe the management path", msg="timed out"))
    assert (e.phase, e.result, e.detail) == ("confirm", "unreachable", ["timed out"])
    assert event_of(facts("none")) is None  # nothing was applied: nothing to confirm
    e = event_of(facts("confirmed"))
    assert (e.host, e.phase, e.result, e.detail) == ("h3", "confirm", "confirmed", [])
    e = event_of(facts("error", "probe of the management path: Timed out after 20 s"))
    assert (e.phase, e.result) == ("confirm", "error")
    assert e.detail == ["probe of the management path: Timed out after 20 s"]
