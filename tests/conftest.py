from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests import netns as nsutil

_counter = itertools.count()


def pytest_collection_modifyitems(config, items):
    if nsutil.is_root():
        return
    skip = pytest.mark.skip(reason="needs root for network namespaces (CI runs as root)")
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_namespaces():
    if nsutil.is_root():
        nsutil.remove_leftovers()
    yield
    if nsutil.is_root():
        nsutil.remove_leftovers()


@pytest.fixture
def make_netns():
    """Factory: make_netns() -> a fresh namespace name with lo up; all removed at teardown."""
    created: list[str] = []

    def make() -> str:
        name = f"{nsutil.PREFIX}{os.getpid()}-{next(_counter)}"
        nsutil.sh(["ip", "netns", "add", name])
        created.append(name)
        nsutil.sh(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    yield make
    for name in created:
        nsutil.sh(["ip", "netns", "del", name], check=False)


@pytest.fixture
def readable_tmp():
    """A temporary directory every user can read (pytest's tmp_path is under a 0700 root
    directory): for job code that `topoctl plan` imports as the unprivileged capture user."""
    d = tempfile.mkdtemp(prefix="tpt-factory-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)
