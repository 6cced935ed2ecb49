"""`topoctl run` reads events only where they come from, and survives any line: what a rank
prints is output (a forged `link-down` included), events come from `[event N]` lines (the rank's
event channel) or bare launcher lines; a malformed event is shown, never a crash; ranks that
report no iteration are a failure (exit 1), not a bug. The launchers' lines are replayed by a
transport that streams them as a host's agent would."""

from __future__ import annotations

import json

import pytest

from topoctl.rollout.run import run_job

HOSTS = ("h0", "h1")


def plan() -> dict:
    """A two-host plan's job part (one rank each), as `topoctl plan` renders it."""
    procs = {h: [{"rank": i, "local_rank": 0, "env": {"RANK": str(i)}}]
             for i, h in enumerate(HOSTS)}
    return {"metadata": {}, "fabric": {}, "hosts": {h: {} for h in HOSTS},
            "job": {"name": "j", "command": ["python", "-m", "topotrain.train"],
                    "world_size": 2, "master": {"address": "10.0.0.1", "port": 29500},
                    "batch": {"global": 2, "per_rank": 1},
                    "model": {}, "processes": procs}}  # no factory: nothing to check


class Replay:
    """A transport whose hosts' launchers print `lines[host]` and exit `rc[host]`."""

    name = "replay"

    def __init__(self, lines: dict[str, list[str]], rc: dict[str, int] | None = None):
        self.lines, self.rc, self.calls = lines, rc or {}, []

    def stream(self, host, args, stdin, on_line, timeout=None) -> int:
        self.calls.append((host, args[0]))
        for line in self.lines.get(host, []):
            on_line(host, line)
        return self.rc.get(host, 0)

    def agent(self, host, args, stdin=None, timeout=120.0):
        self.calls.append((host, args[0]))

    def close(self) -> None:
        pass


def ev(**e) -> str:
    return json.dumps(e)


def good(rank: int, checksum: str = "c") -> list[str]:
    return [f"[event {rank}] " + ev(event="iter", rank=rank, iter=0, seconds=0.1),
            f"[event {rank}] " + ev(event="done", rank=rank, checksum=checksum)]


def test_a_rank_printing_a_link_down_event_is_not_a_failed_cable():
    forged = ev(event="link-down", interface="eth0", reason="no carrier", at=1.0)
    lines = {"h0": [f"[rank 0] {forged}", *good(0)], "h1": [f"[rank 1] {forged}", *good(1)]}
    out: list[str] = []
    result = run_job(plan(), Replay(lines), iterations=1, out=out.append, watch=False)
    assert result.exit_code == 0 and result.links_down == []
    assert f"h0 [rank 0] {forged}" in out  # shown as the output it is
    # the same line from the launcher itself is a failed cable
    lines["h0"].insert(0, forged)
    result = run_job(plan(), Replay(lines), iterations=1, out=out.append, watch=False)
    assert result.failed_cables == ["h0:eth0"]


FAILED_EVENT = ev(event="failed", rank=0, rc=1, last=[{"x": 1}])  # odd, but a rank failed
MALFORMED = [
    "[event 0] {", "[event 0] []", "[event x] {}", "[event 0] " + ev(event="iter"),
    "[event 0] " + ev(event="iter", seconds="slow"),
    "[event 0] " + ev(event="iter", seconds=float("nan")),
    "[event 0] " + ev(event="iter", seconds=0.1, allreduce=[[1, 2]]),
    "[event 0] " + ev(event="done", checksum=["unhashable"]),
    "[event 0] " + ev(event="done"), "[event 0] " + ev(event="resume", iteration="x"),
    "[event 7] " + ev(event="iter", seconds=0.1),
    "[event 0] " + ev(event="failed", rank=0, rc=1, last=[]),  # not a rank's kind
    ev(event="failed"), FAILED_EVENT,
    ev(event="link-down"), ev(event="warning"), ev(event="iter", seconds=0.1),
    "[rank] x", "[rank 0]", "", "\x00", '{"event": "link-down", "interface": ',
    # what a rank prints is never read as an event, however it looks
    "[rank 0] " + ev(event="iter"), "[rank 0] " + ev(event="done", checksum=[1]),
    "[rank 0] " + ev(event="iter", rank=0, seconds=9.0),
]


@pytest.mark.parametrize("line", MALFORMED)
def test_any_event_line_leaves_the_run_standing(line):
    lines = {"h0": [line, *good(0)], "h1": good(1)}
    out: list[str] = []
    result = run_job(plan(), Replay(lines), iterations=1, out=out.append, watch=False)
    json.dumps(result.to_dict())  # the --json report is always writable
    if line == FAILED_EVENT:
        assert result.exit_code == 1 and "rank 0 on h0 exited 1" in result.failure
        return
    # the run is what it would have been without the line
    assert result.exit_code == 0, result.failure
    assert [len(r.iterations) for r in result.ranks.values()] == [1, 1]
    assert result.synchronous and result.iteration_time == pytest.approx(0.1)


def test_ranks_that_report_no_iteration_are_supervised_by_exit_status():
    """A user's own script need not report: ranks that end well without events succeed."""
    lines = {h: [f"[rank {i}] hello"] for i, h in enumerate(HOSTS)}
    result = run_job(plan(), Replay(lines), iterations=1, out=lambda s: None, watch=False)
    assert result.exit_code == 0 and not result.failure
    assert result.iteration_time is None and not result.checksums_reported


def test_a_done_without_checksum_is_not_reported_rather_than_different():
    lines = {h: [f'[event {i}] {{"event": "iter", "rank": {i}, "iter": 1, "seconds": 0.1}}',
                 f'[event {i}] {{"event": "done", "rank": {i}}}'] for i, h in enumerate(HOSTS)}
    result = run_job(plan(), Replay(lines), iterations=1, out=lambda s: None, watch=False)
    assert result.exit_code == 0 and result.iteration_time == pytest.approx(0.1)
    assert not result.checksums_reported


def test_a_plan_cannot_ask_for_root_ranks_but_the_operator_can():
    p = plan()
    p["job"]["user"] = "root"
    with pytest.raises(Exception) as e:
        run_job(p, Replay({}), iterations=1, out=lambda s: None, watch=False)
    assert getattr(e.value, "path", "") == "job.user" and "--user root" in str(e.value)
    lines = {"h0": good(0), "h1": good(1)}
    assert run_job(p, Replay(lines), iterations=1, out=lambda s: None, watch=False,
                   user="root").exit_code == 0
