from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests import netns as nsutil
from topoctl.lab import lab as labmod
from topoctl.lab import owners

_counter = itertools.count()
_CACHE_ENV = "TOPOCTL_CACHE"  # the planner's op times and the runtime's calibration live there


def pytest_configure(config):
    """Labs this run builds belong to it (`topoctl.lab.owners`: the workers inherit the
    controller's pid), and the labs of earlier runs that were killed before taking theirs down
    go first; then `_own_cache`."""
    owners.claim()
    if not hasattr(config, "workerinput") and nsutil.is_root():
        for lab in labmod.orphaned_labs():
            labmod.down(lab)
    _own_cache(config)


def _own_cache(config) -> None:
    """Give the whole run (every xdist worker inherits the controller's environment) a cache of
    its own, empty, unless the caller chose one: op times taken while the suite loads the cores,
    or a calibration a test re-measures, must never land in the user's ~/.cache/topoctl, which
    the benchmarks and `topoctl plan` predict with; and a test must not pass locally only
    because the user's cache holds a timing that CI's clean machine does not."""
    if hasattr(config, "workerinput") or os.environ.get(_CACHE_ENV):
        return
    config._topoctl_cache = tempfile.mkdtemp(prefix="tpt-cache-")
    os.environ[_CACHE_ENV] = config._topoctl_cache


def pytest_unconfigure(config):
    cache = getattr(config, "_topoctl_cache", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop(_CACHE_ENV, None)


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


@pytest.fixture(scope="module")
def agent_fork(tmp_path_factory):
    """One `topo-agent` fork server per module (tests.integration.forkagent) for the agent calls
    of `tests.integration.test_agent.host`: every call is still a process of its own running
    `topoagent.cli.main`, forked from a server that imported the agent once, so a module of
    many short calls does not pay the interpreter's start-up and the agent's imports each time
    (0.4-0.5 CPU-s a call on the 2-core AMD VM, most of a short call)."""
    from tests.integration.forkagent import ForkAgent  # only modules that use `host` start one

    fork = ForkAgent(tmp_path_factory.mktemp("agentfork"))
    yield fork
    fork.close()


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
