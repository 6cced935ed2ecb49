"""Placement search: which device runs each node of a (coarse) operator graph.

- `problem`: the problem as plain data, the shared objective (first micro-batch's makespan +
  (micro-batches - 1) x bottleneck load), the list schedule of an assignment, a lower bound.
- `milp`: the exact MILP's formulation and its from-scratch solve (HiGHS via
  scipy.optimize.milp, deterministic node limit, gap).
- `improve`: the MILP warm-started from a placement (highspy: incumbent, upper bound, cut-off).
- `search`: the coarse-graph search: the heuristics' candidates scored by the caller's
  simulator, optionally the warm-started MILP.
- `heft`: HEFT list scheduling (plus the two baselines as candidates).
- `partition`: balanced contiguous pipeline partition (DP), the baseline.
- `build`: a problem from a coarse graph, per-device-type costs and the fabric's routes.
All pure functions; `topoctl.strategies.placement` composes them into a planner strategy.
"""
