"""The lab the rollout, fault and Ansible end-to-end tests run against: 4 hosts cut from
plans/hetero8-cluster.yaml (tests/e2e/data/ring4-cluster.yaml) and the plan `topoctl plan`
renders for it with plans/mlp-job.yaml. Half the hosts of hetero8: a rollout's behaviour (two
phases, every other host rolled back, a host cut off or starved) does not depend on the host
count, while every host's agent calls cost CPU the suite pays."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
CLUSTER = DATA / "ring4-cluster.yaml"
PLAN = DATA / "mlp-ring4-plan.yaml"  # topoctl plan CLUSTER plans/mlp-job.yaml -o PLAN
HOSTS = {"h0", "h1", "h2", "h3"}
