"""The runtime's CPU calibration: a real micro-benchmark (gloo processes on loopback), cached
per machine under $TOPOCTL_CACHE/runtime/, read back by the planner's public function.

The micro-benchmark costs ~40 s of CPU on 2 cores, so the module measures once (the fixture
``measured``, as the planner's `--retime` does: its processes forked from the fork server) and
both tests check that one measurement: as root it runs with the machine set to reno and only
reno allowed to other namespaces, which is the harder case for the calibration's own namespace
(its congestion control must be allowed for it first) and runs the same code as the
unrestricted machine (as root the pairs always run in a throwaway namespace given
:data:`TCP_CONGESTION`; the allowed-list handling of an unrestricted machine is also exercised
by every lab test through the same ``set_congestion_control``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests import netns as nsutil
from topoctl.collective.trees.pipeline import runtime_costs
from topotrain.collectives import calibration_path, load_calibration
from topotrain.collectives.calibrate import TCP_CONGESTION

# a CPU micro-benchmark, under the machine's TCP congestion control set to reno (machine-wide)
pytestmark = pytest.mark.serial

KEYS = ("per_message_s", "per_message_shared_s", "wire_bytes_per_s", "reduce_bytes_per_s",
        "copy_bytes_per_s", "per_piece_s", "cores")


def calibrate(*args: str, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topotrain.collectives.calibrate", *args],
                          capture_output=True, text=True, env=env, timeout=600)


# what `topoctl plan --retime` and the demo run: the measuring processes fork from the
# planner's fork server (torch imported once) instead of starting fresh interpreters
PLANNER_RETIME = ("import json; from topoctl.graph.profile import retime_runtime_calibration; "
                  "from topotrain.timing import load_calibration; retime_runtime_calibration(); "
                  "print(json.dumps(load_calibration()))")


def planner_retime(env) -> tuple[subprocess.CompletedProcess, int]:
    """The planner's retiming in a process of its own; (its result, its pid: the calibration
    names its namespace after it)."""
    with subprocess.Popen([sys.executable, "-c", PLANNER_RETIME], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as p:
        out, err = p.communicate(timeout=600)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), p.pid


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The one measurement of the module, into an empty cache; as root under
    :func:`nsutil.restricted_congestion`, recording the allowed list during the run and the
    calibration namespaces left right after it."""
    cache = tmp_path_factory.mktemp("calibration")
    env = os.environ | {"TOPOCTL_CACHE": str(cache)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOCTL_CACHE", str(cache))
        empty_before = load_calibration() is None
    allowed_during = None
    if nsutil.is_root():
        with nsutil.restricted_congestion():
            r, pid = planner_retime(env)
            allowed_during = nsutil.CC_ALLOWED.read_text().split()
    else:
        r, pid = planner_retime(env)
    # its own namespace only: another process may be calibrating beside the test
    left = [n for n in nsutil.list_netns() if n == f"tpc-{pid}"] if nsutil.is_root() else []
    return SimpleNamespace(cache=cache, env=env, result=r, empty_before=empty_before,
                           allowed_during=allowed_during, netns_left=left)


@pytest.mark.timeout(900)
def test_calibration_measures_once_and_is_cached(measured, monkeypatch):
    monkeypatch.setenv("TOPOCTL_CACHE", str(measured.cache))
    env = measured.env
    assert measured.empty_before
    r = measured.result
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Warning" not in r.stderr, r.stderr[-2000:]
    data = json.loads(r.stdout)
    path = calibration_path()
    assert path.parent == measured.cache / "runtime" and path.exists()
    for k in KEYS:
        assert data[k] > 0, k
    # plausible magnitudes for a CPU: a message costs 1 us .. 10 ms of CPU, memory moves at
    # 100 MB/s .. 1 TB/s per CPU second
    assert 1e-6 < data["per_message_s"] < 1e-2
    assert 1e8 < data["reduce_bytes_per_s"] < 1e12
    # cached: the command reads it back and does not measure again (same document, no new
    # load average)
    again = calibrate("--json", env=env)
    assert "Warning" not in again.stderr, again.stderr[-2000:]
    assert json.loads(again.stdout) == data
    costs = runtime_costs(load_calibration())
    assert costs.source == f"calibrated:{data['key']}"
    assert costs.per_message_s == data["per_message_s"]
    # a damaged cache is not used
    saved = path.read_text()
    try:
        path.write_text("{not json")
        assert load_calibration() is None
        path.write_text(json.dumps(data | {"per_message_s": -1}))
        assert load_calibration() is None
    finally:
        path.write_text(saved)


@pytest.mark.netns
@pytest.mark.timeout(900)
def test_calibration_runs_under_the_lab_hosts_congestion_control(measured):
    """As root the pairs run in a throwaway namespace with the lab hosts' congestion control,
    whatever the machine's is and whether or not namespaces are allowed to choose it (reno and
    only reno here), and the namespace is gone afterwards, the allowed list as it was."""
    assert measured.allowed_during == ["reno"]
    r = measured.result
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["tcp_congestion"] == TCP_CONGESTION
    assert measured.netns_left == []
