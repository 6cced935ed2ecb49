"""Benchmark programs (not library), one subpackage per subject (demo, agent, lab, planner,
placement, trees, sync, tag, topoopt), run from the repository root as `python -m
bench.SUBJECT.NAME` (`make demo`: `python -m bench.demo`; some through `topoctl bench NAME`).
Shared helpers: `bench.common` (paths, defaults, synthetic clusters, machine CPU readings),
`bench.common.trees` (the tree runtime's cost model on a cluster file's cables). Each program's
results, where the docs cite them: `bench/results/`."""

from topoctl.lab import owners

# Labs a benchmark builds (many do: bench.demo, bench.planner.lab_check, ...) belong to its run,
# so that `topoctl lab down --orphans` (and the test suite at its start) removes them when the
# run is killed before its own teardown; a benchmark started by a test keeps the test's owner.
owners.claim()
