"""`topoctl lab down --orphans` and `lab list` against real owner records and a real orphan
lab (its namespace, its owner record naming an exited process), beside owner records whose
names no lab can have (issue 50 item 13: one such record made `down --orphans` abort, so the
real orphans stayed; `lab list` did not show an orphan known only by its record). The bad
names are a family: the audit's case and its neighbours."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests import netns as nsutil
from topoctl import cli as topoctl_cli
from topoctl.lab import lab as labmod
from topoctl.lab import owners

pytestmark = pytest.mark.netns

TAG = os.getpid() % 100000
BAD_NAMES = ["Bad", "9lab", "lab-x", "toolongname1", ".hidden", "ünï", " sp", "a b", "_x"]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def orphans(tmp_path):
    """A real orphan lab (a namespace of its prefix, its record naming an exited owner), a
    record-only orphan, and bad records; everything removed afterwards."""
    real, record_only = f"zo{TAG}", f"zr{TAG}"
    ns = f"tp-{real}-h0"
    owners.OWNERS_DIR.mkdir(parents=True, exist_ok=True)
    bad = [f"{b}{TAG}" for b in BAD_NAMES]
    made = [real, record_only, *bad]
    nsutil.sh(["ip", "netns", "add", ns])
    try:
        for name in made:
            (owners.OWNERS_DIR / name).write_text(f"{_dead_pid()} 1\n")
        yield real, record_only, ns, bad
    finally:
        nsutil.sh(["ip", "netns", "del", ns], check=False)
        for name in made:
            (owners.OWNERS_DIR / name).unlink(missing_ok=True)


def _run(argv, capsys) -> tuple[int, str, str]:
    rc = topoctl_cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_lab_list_marks_record_only_orphans_and_names_bad_records(orphans, tmp_path, capsys):
    real, record_only, _, bad = orphans
    rc, out, err = _run(["lab", "list", "--state-dir", str(tmp_path)], capsys)
    assert rc == 0, err
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert "orphan" in lines[real] and "record only" not in lines[real]
    assert "orphan, owner record only" in lines[record_only]
    for b in bad:
        assert repr(b) not in lines and f"{owners.OWNERS_DIR / b}:" in err, err
    rc, out, _ = _run(["--json", "lab", "list", "--state-dir", str(tmp_path)], capsys)
    doc = json.loads(out)
    assert {real, record_only} <= set(doc["orphans"]) and record_only in doc["record_only"]
    assert set(bad) <= set(doc["skipped_records"])


def test_down_orphans_removes_the_real_orphans_beside_bad_records(orphans, tmp_path, capsys):
    real, record_only, ns, bad = orphans
    rc, out, err = _run(["lab", "down", "--orphans", "--state-dir", str(tmp_path)], capsys)
    assert rc == 0, err
    assert "Traceback" not in err
    assert ns not in nsutil.sh(["ip", "netns", "list"]).stdout  # the real orphan is gone
    assert not (owners.OWNERS_DIR / real).exists()
    assert not (owners.OWNERS_DIR / record_only).exists()
    for b in bad:  # skipped, named, kept for the operator
        assert (owners.OWNERS_DIR / b).exists()
        assert f"{owners.OWNERS_DIR / b}:" in err and "skipped" in err
    assert real in out and record_only in out
    assert real not in labmod.orphaned_labs(tmp_path)
