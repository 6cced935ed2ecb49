"""Benchmarks of the planner: capture and cost model (`capture`), simulation (`sim`) and
rendering (`render`) at scale, the `+bandwidth` post-pass in the simulator (`bandwidth_sim`),
predicted against measured iteration time in the lab (`lab_check`), and every strategy on hosts
with several accelerators (`multidevice`, issue 51)."""
