"""Model capture runs the job's code (`model.factory`) in a child process as an unprivileged
user, never as root (issue 11, "Trust and files"): a factory that records its uid and writes
a file does so as `nobody` (or $TOPOCTL_CAPTURE_USER), read back with os.stat; a factory that
fails, or one the capture user cannot read, is a clean JobError naming `model.factory` and the
user; `topoctl plan` on such a job exits 1 with `topoctl: FILE: model.factory: ...`."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
import yaml

from tests.fuzzgen import topoctl
from topoctl.planner import make_plan
from topoctl.spec.cluster_load import parse_cluster
from topoctl.spec.job import JobError, parse_job

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user "
                                                          "(CI runs as root)")

FACTORY = '''
import os
from torch import nn

def build(record, width=4):
    # what the planner ran as: real and effective ids, groups, and a file it created
    with open(record, "w") as f:
        f.write(f"{os.getuid()} {os.geteuid()} {os.getgid()} {sorted(os.getgroups())}")
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2))

def broken():
    raise RuntimeError("the factory is broken on purpose")

def not_a_module():
    return 42
'''
CLUSTER = {"apiVersion": "topoctl/v1", "kind": "Cluster", "name": "fzcap",
           "defaults": {"nic_speed": "100mbit", "gpus": {"count": 1, "type": "A100"}},
           "hosts": [{"name": f"h{i}", "nics": [{"name": "eth0"}, {"name": "eth1"}]}
                     for i in range(2)],
           "fabric": {"kind": "direct", "links": [{"a": "h0:eth0", "b": "h1:eth1"}]}}


def _job(factory: str, **kwargs) -> dict:
    return {"apiVersion": "topoctl/v1", "kind": "Job", "name": "cap",
            "model": {"factory": factory, "kwargs": kwargs, "inputs": [{"shape": [8]}]},
            "batch": {"global": 4}, "strategies": ["baseline"],
            "cost": {"method": "roofline", "device": "A100"}}


@pytest.fixture
def factory_dir(readable_tmp, monkeypatch):
    (readable_tmp / "tpt_capfactory.py").write_text(FACTORY)
    out = readable_tmp / "out"
    out.mkdir()
    os.chmod(out, 0o1777)  # the capture user may write here, like /tmp
    monkeypatch.syspath_prepend(str(readable_tmp))
    return readable_tmp


@pytest.mark.parametrize("user", ["nobody", "daemon"])
def test_factory_runs_as_the_unprivileged_capture_user(factory_dir, monkeypatch, user):
    monkeypatch.setenv("TOPOCTL_CAPTURE_USER", user)
    record = factory_dir / "out" / f"record-{user}"
    make_plan(parse_cluster(CLUSTER), parse_job(_job("tpt_capfactory:build",
                                                     record=str(record))), use_cache=False)
    pw = pwd.getpwnam(user)
    uid, euid, gid, groups = record.read_text().split(" ", 3)
    assert (int(uid), int(euid), int(gid)) == (pw.pw_uid, pw.pw_uid, pw.pw_gid)
    assert groups == "[]" or groups == f"[{pw.pw_gid}]", groups  # no root groups kept
    st = record.stat()  # the kernel's view of who wrote it
    assert (st.st_uid, st.st_gid) == (pw.pw_uid, pw.pw_gid) and st.st_uid != 0


def test_factory_cannot_write_where_only_root_can(factory_dir, monkeypatch):
    """The same factory asked to write into a root-only directory fails as that user would:
    a clean error, and the file is not there."""
    monkeypatch.delenv("TOPOCTL_CAPTURE_USER", raising=False)
    private = factory_dir / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(JobError) as e:
        make_plan(parse_cluster(CLUSTER), parse_job(_job(
            "tpt_capfactory:build", record=str(private / "x"))), use_cache=False)
    assert "PermissionError" in str(e.value) and "as user nobody" in str(e.value), str(e.value)
    assert not (private / "x").exists()


@pytest.mark.parametrize(("factory", "says"), [
    ("tpt_capfactory:broken", "the factory failed: RuntimeError: the factory is broken on "
                              "purpose"),
    ("tpt_capfactory:not_a_module", "returned int, not a torch.nn.Module"),
    ("tpt_capfactory:nosuch", "has no callable nosuch"),
    ("tpt_nosuchmodule:build", "cannot import tpt_nosuchmodule"),
])
def test_failing_factory_is_a_clean_error(factory_dir, tmp_path, factory, says):
    """Through `topoctl plan` (in process: one capture child per case): exit 1, `topoctl:
    JOB: model.factory: ...`, the user named, no traceback, no plan written."""
    cluster, job = tmp_path / "c.yaml", tmp_path / "j.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    job.write_text(yaml.safe_dump(_job(factory)))
    rc, _, err = topoctl(["plan", str(cluster), str(job), "-o", str(tmp_path / "p.yaml")])
    assert rc == 1 and f"topoctl: {job}: model.factory: " in err and says in err, err
    assert "(captured as user nobody" in err, err
    assert "Traceback" not in err and not (tmp_path / "p.yaml").exists()


def test_unknown_capture_user_is_a_clean_error(factory_dir, monkeypatch):
    monkeypatch.setenv("TOPOCTL_CAPTURE_USER", "tpt-no-such-user")
    with pytest.raises(JobError, match="no user 'tpt-no-such-user'"):
        make_plan(parse_cluster(CLUSTER), parse_job(_job("tpt_capfactory:build",
                                                         record="/dev/null")), use_cache=False)


def test_module_the_capture_user_cannot_read(tmp_path, monkeypatch):
    """pytest's tmp_path is under a 0700 root directory: nobody cannot import from it, and
    the error says what to do."""
    (tmp_path / "tpt_private_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TOPOCTL_CAPTURE_USER", raising=False)
    with pytest.raises(JobError, match="must be readable by user nobody"):
        make_plan(parse_cluster(CLUSTER), parse_job(_job("tpt_private_factory:build",
                                                         record="/dev/null")), use_cache=False)
    assert Path(tmp_path).stat().st_uid == 0


def test_missing_capture_interpreter_is_a_clean_error(factory_dir, monkeypatch):
    monkeypatch.setenv("TOPOCTL_CAPTURE_PYTHON", "/nonexistent/python3")
    with pytest.raises(JobError, match="cannot start the capture interpreter /nonexistent"):
        make_plan(parse_cluster(CLUSTER), parse_job(_job("tpt_capfactory:build",
                                                         record="/dev/null")), use_cache=False)
