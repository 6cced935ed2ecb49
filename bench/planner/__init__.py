"""Benchmarks of the planner: capture and cost model (`capture`), simulation (`sim`) and
rendering (`render`) at scale, the `+bandwidth` post-pass in the simulator (`bandwidth_sim`),
and predicted against measured iteration time in the lab (`lab_check`)."""
