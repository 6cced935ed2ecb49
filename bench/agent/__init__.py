"""Benchmarks of the agent and the rollout: topo-agent's apply on one host at scale (`apply`),
`topoctl apply` of a whole lab plan (`rollout`), heal time after a cable cut (`heal`)."""
