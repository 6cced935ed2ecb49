"""The suite never writes the user's cache: `tests/conftest.py` points $TOPOCTL_CACHE at a run
directory of its own before any test (and every xdist worker) starts."""

from __future__ import annotations

import os
from pathlib import Path

from topoctl.graph.cache import cache_dir
from topotrain.timing import calibration_path


def test_the_suite_plans_into_a_cache_of_its_own():
    home_cache = Path.home() / ".cache" / "topoctl"
    run_cache = Path(os.environ["TOPOCTL_CACHE"])
    assert run_cache != home_cache
    for path in (cache_dir(), calibration_path()):
        assert run_cache in path.parents, path
        assert home_cache not in path.parents, path
