"""A process that enters a namespace through `Target.enter` (the agent's launcher, the
namespace transport) sees the namespace's own /etc files (`/etc/netns/NAME/FILE`) as `ip netns
exec` would show them, and the machine's /etc stays as it was."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from topoagent.target import NETNS_ETC_DIR, Target, files_only_nsswitch

pytestmark = pytest.mark.netns

NAME = "tpname-marker.lab"  # resolvable only through the namespace's hosts file


def test_enter_uses_the_namespaces_etc_files(make_netns):
    ns = make_netns()
    etc = NETNS_ETC_DIR / ns
    etc.mkdir(parents=True)
    try:
        (etc / "hosts").write_text(f"10.236.250.1 {NAME}\n")
        inside = subprocess.run(["getent", "hosts", NAME], capture_output=True, text=True,
                                preexec_fn=Target(netns=ns).enter, timeout=30)
        assert inside.returncode == 0 and "10.236.250.1" in inside.stdout, inside
        outside = subprocess.run(["getent", "hosts", NAME], capture_output=True, text=True,
                                 timeout=30)
        assert outside.returncode != 0  # the machine's /etc/hosts is untouched
        assert NAME not in Path("/etc/hosts").read_text()
    finally:
        shutil.rmtree(etc, ignore_errors=True)


def test_without_etc_files_nothing_changes(make_netns):
    ns = make_netns()
    inside = subprocess.run(["cat", "/etc/hosts"], capture_output=True, text=True,
                            preexec_fn=Target(netns=ns).enter, timeout=30)
    assert inside.stdout == Path("/etc/hosts").read_text()


def test_files_only_nsswitch_keeps_everything_but_hosts():
    text = "passwd: files systemd\nhosts:  files dns myhostname\nnetworks: files\n"
    out = files_only_nsswitch(text)
    assert "dns" not in out and out.splitlines()[-1].split() == ["hosts:", "files"]
    assert "passwd: files systemd" in out and "networks: files" in out
