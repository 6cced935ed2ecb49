"""Typed, validated input files of the controller: `cluster.yaml` (spec.cluster) and `job.yaml`
(spec.job). Errors name the YAML path, in the style of the agent's HostState schema."""
