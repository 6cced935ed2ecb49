"""Benchmarks of placement and pipelines: the placement search against the MILP (`search`), per-
op costs charged to a stage (`stage_fit`), hybrid plans' phases (`hybrid_phases`) and a hybrid
plan in the lab (`hybrid_lab_check`)."""
