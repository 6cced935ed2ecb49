"""Benchmark programs (not library), run from the repository root as `python -m bench.NAME`
(some through `topoctl bench NAME`). Shared helpers: `bench.common` (paths, defaults, synthetic
clusters, machine CPU readings), `bench.trees_common` (the tree runtime's cost model on a
cluster file's cables). Each program's results, where the docs cite them: `bench/results/`."""
