"""TopoOpt's benchmarks: at scale in the simulator (`sim`) and the 12-host testbed in the lab
(`lab`)."""
