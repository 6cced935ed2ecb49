"""`topoctl.lab.owners`: a record names a live owner only while that very process runs (its
start time guards against a new process that reuses the pid); records of a person's labs are
never made."""

from __future__ import annotations

import os
import subprocess

from topoctl.lab import owners


def test_record_names_the_owner_until_it_exits(tmp_path, monkeypatch):
    child = subprocess.Popen(["sleep", "300"])
    try:
        monkeypatch.setenv(owners.OWNER_ENV, str(child.pid))
        assert owners.record("a", tmp_path) == child.pid
        assert owners.owner("a", tmp_path) == (child.pid, True)
        assert owners.orphans(["a", "b"], tmp_path) == []
    finally:
        child.kill()
        child.wait()
    assert owners.owner("a", tmp_path) == (child.pid, False)
    assert owners.orphans(["a", "b"], tmp_path) == ["a"] and owners.recorded(tmp_path) == ["a"]
    owners.forget("a", tmp_path)
    assert owners.recorded(tmp_path) == [] and owners.owner("a", tmp_path) is None


def test_a_reused_pid_is_not_the_owner(tmp_path):
    # this process's pid with another start time: the owner that recorded it has exited
    (tmp_path / "a").write_text(f"{os.getpid()} 1\n")
    assert owners.owner("a", tmp_path) == (os.getpid(), False)


def test_no_owner_no_record(tmp_path, monkeypatch):
    monkeypatch.delenv(owners.OWNER_ENV, raising=False)
    assert owners.record("a", tmp_path) is None
    monkeypatch.setenv(owners.OWNER_ENV, "not-a-pid")
    assert owners.record("a", tmp_path) is None
    assert owners.recorded(tmp_path) == [] and owners.orphans(["a"], tmp_path) == []


def test_claim_keeps_an_owner_already_set(monkeypatch):
    monkeypatch.setenv(owners.OWNER_ENV, "1")
    owners.claim()
    assert os.environ[owners.OWNER_ENV] == "1"
    monkeypatch.delenv(owners.OWNER_ENV)
    owners.claim()
    assert os.environ[owners.OWNER_ENV] == str(os.getpid())
