"""The lab transport's forked agents (`topoagent.zygote`) answer as agents run as processes of
their own (`LocalTransport(zygote=False)`, every call before the fork server): the same exit
codes (0, 2 with --detailed-exitcode, 1 for bad input, a signal's negative code), stdout and
stderr apart, the host's environment reaching the agent, a timeout's kill, concurrent calls
from threads, a `launch`'s output line by line as it comes and `close` ending it; after
`close` neither the server nor any agent or rank is left (read in /proc)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from topoctl.rollout.run import job_payload
from topoctl.rollout.transports import UNREACHABLE
from topoctl.rollout.transports.local import LocalTransport

pytestmark = pytest.mark.netns

FORWARD = "sysctl: {ip_forward: true}\n"


@pytest.fixture
def transports(make_netns, tmp_path):
    """Factory: transport(forked, env) -> a LocalTransport to host h0 in a fresh namespace
    with a state directory of its own; all closed at teardown."""
    made: list[LocalTransport] = []

    def transport(forked: bool, env: dict[str, str] | None = None) -> LocalTransport:
        t = LocalTransport({"h0": make_netns()}, {"h0": tmp_path / f"state{len(made)}"},
                           env={"h0": env} if env else None, zygote=forked)
        made.append(t)
        return t

    yield transport
    for t in made:
        t.close()


def _comparable(out: str) -> dict:
    doc = json.loads(out)
    doc.pop("seconds", None)  # the one field that differs between two runs
    return doc


def _proc_cmdlines() -> dict[int, str]:
    """pid -> its command line, arguments apart by NUL."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = (d / "cmdline").read_bytes().rstrip(b"\0").decode()
            except OSError:
                pass
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_forked_agents_answer_as_processes_do(transports):
    replies = {}
    for forked in (False, True):
        t = transports(forked)
        replies[forked] = [t.agent("h0", ["show"]),
                           t.agent("h0", ["diff", "-"], FORWARD),
                           t.agent("h0", ["diff", "-"], "routes: nope\n"),
                           t.agent("h0", ["bogus"])]
        assert (t.zygote is not None and t.zygote.pid is not None) == forked
    for before, now in zip(replies[False], replies[True], strict=True):
        assert (now.rc, now.killed, now.err) == (before.rc, before.killed, before.err)
        assert _comparable(now.out) == _comparable(before.out)
    show, changes, bad, usage = replies[True]
    assert [r.rc for r in replies[True]] == [0, 2, 1, 1]
    assert json.loads(show.out)["interfaces"][0]["name"] == "lo" and show.err == ""
    assert "sysctl net.ipv4.ip_forward = 1" in changes.out
    assert json.loads(bad.out)["problems"] == [{"path": "routes",
                                                "message": "Input should be a valid list"}]
    # a usage error: the JSON document on stdout, argparse's usage on stderr
    assert "invalid choice: 'bogus'" in json.loads(usage.out)["error"]
    assert usage.err.startswith("usage: topo-agent") and "{" not in usage.err


def test_the_hosts_environment_reaches_the_agent_and_a_signal_is_reported(transports):
    """The test-only crash switch, set only in the host's environment, SIGKILLs the agent
    after its first operation: -9 as `subprocess` reports it."""
    crashed = {forked: transports(forked, {"TOPO_AGENT_CRASH_AFTER": "1"})
               .agent("h0", ["apply", "-"], FORWARD) for forked in (False, True)}
    assert crashed[True].rc == crashed[False].rc == -9
    assert crashed[True].killed == crashed[False].killed == "signal 9, SIGKILL"
    assert crashed[True].out == crashed[False].out == ""


def test_a_timeout_kills_the_agent(transports):
    for forked in (False, True):
        t = transports(forked)
        start = time.monotonic()
        r = t.agent("h0", ["watch", "--interval", "0.2"], timeout=1.5)
        assert r.rc == UNREACHABLE and r.err == "agent timed out after 2s", r
        assert time.monotonic() - start < 10
        if forked:
            assert t.zygote is not None and t.zygote.pid is not None
            assert _children(t.zygote.pid) == []  # killed and reaped


def test_concurrent_calls_from_threads(transports):
    t = transports(True)
    calls = [(["show"], None), (["diff", "-"], FORWARD)] * 4
    with ThreadPoolExecutor(len(calls)) as pool:
        replies = list(pool.map(lambda c: t.agent("h0", *c), calls))
    assert [r.rc for r in replies] == [0, 2] * 4
    assert len({r.out for r in replies[::2]}) == 1  # every show saw the same host
    assert all("ip_forward = 1" in r.out for r in replies[1::2])


def _launch(marker: str) -> str:
    """A one-rank job: a line, 0.6 s, the host's variable as the rank sees it, then a sleep
    only SIGTERM (the launcher stopping its ranks) ends."""
    script = f'echo first; sleep 0.6; echo "probe=$TPZ_PROBE"; exec sleep 60 # {marker}'
    plan = {"metadata": {}, "fabric": {}, "hosts": {"h0": {}},
            "job": {"name": "zyg", "command": ["sh", "-c", script], "world_size": 1,
                    "master": {"address": "127.0.0.1", "port": 29531},
                    "batch": {"global": 1, "per_rank": 1}, "model": {},
                    "processes": {"h0": [{"rank": 0, "local_rank": 0, "env": {"RANK": "0"}}]}}}
    return json.dumps(job_payload(plan, 1, watch=False))


def _stream_and_close(t: LocalTransport, marker: str
                      ) -> tuple[int, list[tuple[float, str]], list[list[str]]]:
    """Stream a launch until the rank printed the probe, then `close`: (exit code, lines with
    their arrival times, the launchers' command lines)."""
    lines: list[tuple[float, str]] = []
    seen = threading.Event()
    codes: list[int] = []

    def on_line(host: str, line: str) -> None:
        lines.append((time.monotonic(), line))
        if "probe=" in line:
            seen.set()

    runner = threading.Thread(target=lambda: codes.append(
        t.stream("h0", ["launch", "--host", "h0", "-"], _launch(marker), on_line)))
    runner.start()
    assert seen.wait(60), lines
    state = str(t.state_dirs["h0"])
    launchers = [c.split("\0") for c in _proc_cmdlines().values()
                 if "\0launch\0" in c and state in c]
    t.close(grace=10)
    runner.join(30)
    assert not runner.is_alive() and codes, lines
    return codes[0], lines, launchers


def test_a_launch_streams_live_and_close_ends_it_leaving_nothing(transports):
    results = {}
    for forked in (False, True):
        marker = f"tpz-zygote-{os.getpid()}-{int(forked)}"
        t = transports(forked, {"TPZ_PROBE": f"seen-{int(forked)}"})
        code, lines, launchers = _stream_and_close(t, marker)
        # `ps` shows a forked agent as the process it stands for
        assert [c[:3] + c[-4:] for c in launchers] == [
            [sys.executable, "-m", "topoagent.cli", "launch", "--host", "h0", "-"]], launchers
        text = [line for _, line in lines]
        first = next(at for at, line in lines if line.endswith("first"))
        probe = next(at for at, line in lines if line.endswith(f"probe=seen-{int(forked)}"))
        assert probe - first > 0.4, text  # the first line came before the rank printed more
        results[forked] = code
        assert t.zygote is None or t.zygote.pid is None  # closed
        state = str(t.state_dirs["h0"])
        left = [c for c in _proc_cmdlines().values() if marker in c or state in c
                or ("topoagent.zygote" in c and str(os.getpid()) in c.split("\0"))]
        assert not left, left
    assert results[True] == results[False] != 0
