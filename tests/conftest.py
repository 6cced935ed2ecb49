from __future__ import annotations

import contextlib
import functools
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


def _locked(what: str, func):
    """`func`, run while holding the machine-wide test lock `what`."""
    @functools.wraps(func)
    def locked(*args, **kwargs):
        with nsutil.machine_lock(what):
            return func(*args, **kwargs)
    return locked


def _locked_context(what: str, func):
    """The context manager `func`, entered and left while holding the machine-wide lock
    `what`."""
    @functools.wraps(func)
    @contextlib.contextmanager
    def locked(*args, **kwargs):
        with nsutil.machine_lock(what), func(*args, **kwargs):
            yield
    return locked


@pytest.fixture(scope="session", autouse=True)
def _one_at_a_time_across_test_processes():
    """The suite runs in several processes (`make test`: pytest-xdist workers), and two steps
    of the real code read something machine-wide, then change it: `lab.up` picks the first
    management block that no address on the machine overlaps, then adds it (two labs coming up
    at once could pick the same block), and `allowed_for_namespaces` widens the machine's
    allowed TCP congestion controls and puts the list it read back (a second process, between
    the two writes, finds cubic allowed, does not widen, and loses it while it sets its
    namespaces). Each runs under its own machine-wide lock here, unchanged otherwise. Only
    as root: nothing else can change these."""
    if not nsutil.is_root():
        yield
        return
    # function-level imports: the lab and the agent's congestion module, only for root runs
    from topoagent import congestion
    from topoctl.lab import lab as labmod

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(labmod, "up", _locked("lab-up", labmod.up))
        mp.setattr(congestion, "allowed_for_namespaces",
                   _locked_context("congestion", congestion.allowed_for_namespaces))
        yield


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
