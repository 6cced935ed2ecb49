"""One capture child per planning call, not one per request (`graph.sandbox.session`), and a
memo of answers that an edited factory invalidates.

Real parts: the factory runs in the capture child as the unprivileged capture user; what the
tests count is what the factory itself records from inside that child (its process id, the
device it builds on, what it read on stdin) in a file, and whether a process id still runs."""

from __future__ import annotations

import os
import time

import pytest

from topoctl.graph import sandbox
from topoctl.graph.capture import CaptureError
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import parse_job

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user "
                                                          "(CI runs as root)")

FACTORY = '''
import os
import sys
import time

import torch
from torch import nn

def build(record, width=4):
    # who built the model, on which device, and what it could read of the request channel;
    # a print on stdout must not corrupt the answer channel
    got = sys.stdin.read()
    print("noise from the factory")
    with open(record, "a") as f:
        f.write(f"{os.getpid()} {torch.empty(0).device.type} {len(got)}\\n")
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2))

def slow(record):
    with open(record, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(120)

def crash(record):
    with open(record, "a") as f:
        f.write(f"{os.getpid()}\\n")
    print("the last words of the factory", file=sys.stderr, flush=True)
    os._exit(3)
'''
CLUSTER = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "fzses",
           "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "A100"}},
           "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                     for i in range(2)],
           "fabric": {"kind": "direct", "links": [{"a": "h0:eth0", "b": "h1:eth1"}]}}


def _job(module: str, factory: str, cost: str, **kwargs) -> dict:
    return {"apiVersion": "topoctl/v1", "kind": "Job", "name": "ses",
            "model": {"factory": f"{module}:{factory}", "kwargs": kwargs,
                      "inputs": [{"shape": [8]}]},
            "batch": {"global": 8}, "strategies": ["baseline"],
            "cost": {"method": cost, "device": "A100"}}


@pytest.fixture
def factory_dir(readable_tmp, monkeypatch):
    """A factory module (a unique name per test: the memo and sys.modules are per process)
    every user can read, and a directory the capture user may write its records into."""
    module = f"tpt_session_{os.getpid()}_{time.monotonic_ns()}"
    (readable_tmp / f"{module}.py").write_text(FACTORY)
    out = readable_tmp / "out"
    out.mkdir()
    os.chmod(out, 0o1777)
    monkeypatch.syspath_prepend(str(readable_tmp))
    monkeypatch.delenv("TOPOCTL_CAPTURE_USER", raising=False)
    return readable_tmp, module


def _records(path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()]


def test_one_planning_call_starts_one_capture_child(factory_dir):
    """A plan whose op times are measured on this CPU asks the child for the graph (built on
    the meta device) and for the op times (built on real tensors): both requests are
    answered by one process (the old code started one per request), the factory reads an
    empty stdin and its prints do not break the answers."""
    d, module = factory_dir
    record = d / "out" / "record"
    doc, ctx, _ = make_plan(parse_cluster(CLUSTER), parse_job(
        _job(module, "build", "measured", record=str(record))), use_cache=False)
    rows = _records(record)
    assert {r[1] for r in rows} == {"meta", "cpu"}, rows  # two kinds of request
    assert len({r[0] for r in rows}) == 1, rows  # one capture process served them all
    assert {r[2] for r in rows} == {"0"}, rows  # it never saw the request channel
    assert int(rows[0][0]) != os.getpid()  # ... which was a child, not this process
    assert ctx.graph.by_name() and doc["metadata"]["strategy"] == "baseline"


def test_an_edited_factory_is_captured_again(factory_dir):
    """The same capture twice in one process runs the factory once (memo); after the
    factory's file changes, the next capture runs the new code in a new process (the old
    memo, keyed on the request alone, answered the old graph)."""
    d, module = factory_dir
    record = d / "out" / "record"
    job = parse_job(_job(module, "build", "roofline", record=str(record)))
    first = sandbox.factory_graph(job, 2)
    assert sandbox.factory_graph(job, 2) == first
    assert len(_records(record)) == 1  # the second answer came from the memo
    src = d / f"{module}.py"
    src.write_text(src.read_text().replace("def build(record, width=4)",
                                           "def build(record, width=8)"))
    again = sandbox.factory_graph(job, 2)
    rows = _records(record)
    assert len(rows) == 2 and rows[0][0] != rows[1][0], rows
    assert [first.ops[1].out_shape, again.ops[1].out_shape] == [(2, 4), (2, 8)], again


def test_a_child_that_hangs_or_dies_is_a_clean_error(factory_dir, monkeypatch):
    """A factory that hangs, asked after another of its module's requests (its child has
    started, torch imported): after TIMEOUT_S the clean error, and the child the session
    kept for the module is gone (killed, not left running). The next request starts a new
    child; a factory that kills it is the clean error with the exit status and its last
    words on stderr."""
    d, module = factory_dir
    record = d / "out" / "record"
    with sandbox.session():
        sandbox.factory_graph(parse_job(_job(module, "build", "roofline", record=str(record))), 2)
        monkeypatch.setattr(sandbox, "TIMEOUT_S", 3.0)
        with pytest.raises(CaptureError, match="took over 3 s"):
            sandbox.factory_graph(parse_job(_job(module, "slow", "roofline",
                                                 record=str(record))), 2)
        pids = {int(r[0]) for r in _records(record)}
        assert len(pids) == 1, pids  # the same child served both
        with pytest.raises(ProcessLookupError):
            os.kill(pids.pop(), 0)
        monkeypatch.setattr(sandbox, "TIMEOUT_S", 600.0)
        with pytest.raises(CaptureError, match="failed [(]exit 3[)]: the last words"):
            sandbox.factory_graph(parse_job(_job(module, "crash", "roofline",
                                                 record=str(record))), 2)
        assert len({int(r[0]) for r in _records(record)}) == 2
