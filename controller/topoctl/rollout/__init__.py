"""Rollout of a plan to its hosts: two-phase apply (`twophase`), training supervision (`run`),
and the transports that reach each host's agent (`transports`)."""
