"""`topoctl run` as its user reads it (issue 50, items 7, 17, 18), with real launchers: each
host is a throwaway namespace with its own `topo-agent` (`LocalTransport`), the ranks are real
processes.

- A failing rank's traceback is printed once: every rank of both hosts raising the same error
  showed it once per rank live, again inside the launcher's JSON `failed` event and again in
  the summary (about 250 lines for 4 ranks); now the first one live, the others one line each.
- `topoctl stop` (the agent's `stop`, as `stop_job` sends it) ends a running `run` as
  "stopped", exit 130 (interrupted), not "training failed" with the ranks' errors; a rank that
  fails while the controller stops the other hosts is still a failure.
- A plan whose model lacks a fusion region or an SFB layer it names, or whose factory returns
  no Module, is refused before any launcher starts, naming the YAML path."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from topoagent.protocol import EXIT_INTERRUPTED
from topoagent.state.host import StateError
from topoctl.rollout.run import run_job, stop_job
from topoctl.rollout.transports.local import LocalTransport

pytestmark = pytest.mark.netns

HOSTS = ("h0", "h1")
EVENT = 'echo \'{"event": "iter", "iter": 0, "seconds": 0.01}\' >&"$TOPOCTL_EVENT_FD"'
FRAMES = 25  # a traceback of this many frames, as a rank that raises prints it


def _plan(command: list[str], per_host: int = 2, model: dict | None = None, **job) -> dict:
    procs = {h: [{"rank": i * per_host + j, "local_rank": j,
                  "env": {"RANK": str(i * per_host + j)}}
                 for j in range(per_host)] for i, h in enumerate(HOSTS)}
    return {"metadata": {}, "fabric": {}, "hosts": {h: {} for h in HOSTS},
            "job": {"name": "sup", "command": command, "world_size": per_host * len(HOSTS),
                    "master": {"address": "127.0.0.1", "port": 29511},
                    "batch": {"global": per_host * len(HOSTS), "per_rank": 1},
                    "model": model or {}, "processes": procs, **job}}


@pytest.fixture
def hosts(make_netns, tmp_path):
    """A transport to one agent per host, each in its own namespace and state directory."""
    transport = LocalTransport({h: make_netns() for h in HOSTS},
                               state_dirs={h: tmp_path / h for h in HOSTS})
    yield transport, tmp_path
    transport.close()
    for h in HOSTS:  # whatever a failed test left running
        transport.agent(h, ["stop"], timeout=30)


def _traceback_script() -> list[str]:
    frames = "".join(f'  File "/srv/train.py", line {i}, in step{i}\\n    step{i + 1}()\\n'
                     for i in range(FRAMES))
    return ["sh", "-c", f"{EVENT}; printf 'Traceback (most recent call last):\\n{frames}"
                        "ValueError: the same error in every rank\\n'; exit 1"]


def test_a_failing_ranks_traceback_is_printed_once(hosts):
    transport, _ = hosts
    lines: list[str] = []
    result = run_job(_plan(_traceback_script()), transport, iterations=3, out=lines.append,
                     live=True)
    shown = "\n".join(lines) + "\n" + result.failure
    assert result.exit_code == 1 and not result.stopped
    assert shown.count("Traceback (most recent call last)") == 1, shown
    assert shown.count('File "/srv/train.py", line 3,') == 1, shown
    assert '{"event": "failed"' not in shown  # the launcher's event is read, not echoed
    first, *others = result.failure.splitlines()
    assert "ValueError: the same error in every rank" in first, result.failure
    assert all(len(x) < 200 and "exited" in x for x in others), result.failure
    assert len(shown.splitlines()) < 2 * FRAMES + 20, len(shown.splitlines())


def test_without_live_output_the_failure_holds_the_last_lines(hosts):
    """`--json` (nothing shown live): the result's failure carries the first rank's last
    lines, once."""
    transport, _ = hosts
    result = run_job(_plan(_traceback_script()), transport, iterations=3, out=lambda s: None)
    assert result.exit_code == 1
    assert result.failure.count("ValueError: the same error in every rank") >= 1
    assert result.failure.count("last lines:") == 1, result.failure


def _wait_running(state: Path, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all((state / h / "run" / "job.pids").exists() for h in HOSTS):
            return
        time.sleep(0.2)
    raise AssertionError("the ranks did not start")


@pytest.mark.parametrize("stopped", [list(HOSTS), ["h1"]])
def test_topoctl_stop_ends_a_run_as_stopped(hosts, stopped):
    """Stopping every host (`topoctl stop`) or one host's agent (`topo-agent stop`): the run
    ends "stopped", exit 130, naming the host(s) stopped; no "training failed"."""
    transport, state = hosts
    plan = _plan(["sh", "-c", f"{EVENT}; exec sleep 600"])
    lines: list[str] = []
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(r=run_job(plan, transport, iterations=3,
                                                             out=lines.append, live=True)))
    t.start()
    _wait_running(state)
    if stopped == list(HOSTS):
        codes = stop_job(plan, transport)  # what `topoctl stop` does, host by host: the
        # run may have stopped a host before the stop reached it (0: nothing ran there)
        assert 2 in codes.values() and set(codes.values()) <= {0, 2}, codes
    else:
        assert transport.agent("h1", ["stop"]).rc == 2
    t.join(120)
    assert not t.is_alive()
    result = got["r"]
    assert result.exit_code == EXIT_INTERRUPTED, (result.failure, lines)
    assert result.stopped and set(result.stopped) <= set(stopped), result.stopped
    assert result.failure.startswith("stopped on"), result.failure
    assert json.loads(json.dumps(result.to_dict()))["stopped"] == result.stopped
    assert not any("failed" in x for x in lines), lines


def test_a_rank_failure_is_not_a_stop(hosts):
    """One host's rank fails; the controller stops the other host (its own stop, not the
    operator's): a failure, exit 1, not "stopped"."""
    transport, _ = hosts
    cmd = ["sh", "-c", f'{EVENT}; if [ "$RANK" = 0 ]; then sleep 1; echo boom; exit 3; fi; '
                       "exec sleep 600"]
    result = run_job(_plan(cmd), transport, iterations=3, out=lambda s: None)
    assert result.exit_code == 1 and not result.stopped, result.failure
    assert "rank 0 on h0 exited 3" in result.failure


FACTORY = '''
from torch import nn

def mlp():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))

def nothing():
    return None
'''


@pytest.mark.parametrize(("factory", "job", "path"), [
    ("mlp", {"fusion": {"mode": "groups", "regions": ["0", "9"]}}, "job.fusion.regions[1]"),
    ("mlp", {"fusion": {"mode": "groups", "regions": ["encoder"]}}, "job.fusion.regions[0]"),
    ("mlp", {"sfb": ["1"]}, "job.sfb[0]"),
    ("mlp", {"sfb": ["fc9"]}, "job.sfb[0]"),
    ("mlp", {"collective": {"algorithm": "ring", "bucket_plan": [
        {"params": ["0.weight", "9.bias"], "bytes": 8}]}},
     "job.collective.bucket_plan[0].params[1]"),
    ("nothing", {}, "job.model.factory"),
])
def test_what_the_model_lacks_is_refused_before_launch(hosts, readable_tmp, monkeypatch,
                                                       factory, job, path):
    transport, state = hosts
    (readable_tmp / "tpt_sup_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(readable_tmp))
    plan = _plan(["python3", "-m", "topotrain.train"], per_host=1,
                 model={"factory": f"tpt_sup_factory:{factory}", "inputs": [{"shape": [8]}]},
                 **job)
    with pytest.raises(StateError) as e:
        run_job(plan, transport, iterations=3, out=lambda s: None)
    assert path in [p for p, _ in e.value.problems], e.value.problems
    assert not any((state / h / "run").exists() for h in HOSTS)  # no launcher ran
