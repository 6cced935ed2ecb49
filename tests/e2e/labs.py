"""The lab the rollout, fault and Ansible end-to-end tests run against: 4 hosts cut from
plans/hetero8-cluster.yaml (tests/e2e/data/ring4-cluster.yaml) and the plan `topoctl plan`
renders for it with plans/mlp-job.yaml. Half the hosts of hetero8: a rollout's behaviour (two
phases, every other host rolled back, a host cut off or starved) does not depend on the host
count, while every host's agent calls cost CPU the suite pays."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.netns import host_dump, ip_json
from topoctl import cli
from topoctl.lab import lab as labmod
from topoctl.spec.cluster_load import load_cluster

DATA = Path(__file__).resolve().parent / "data"
CLUSTER = DATA / "ring4-cluster.yaml"
PLAN = DATA / "mlp-ring4-plan.yaml"  # topoctl plan CLUSTER plans/mlp-job.yaml -o PLAN
HOSTS = {"h0", "h1", "h2", "h3"}


@contextlib.contextmanager
def ring4_lab(lab_dir: Path, prefix: str) -> Iterator[labmod.Lab]:
    """The 4-host lab under `lab_dir` (as $TOPOCTL_LAB_DIR), named `prefix` + this process's pid
    (so modules and xdist workers can run side by side), always torn down."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOCTL_LAB_DIR", str(lab_dir))
        name = f"{prefix}{os.getpid() % 10**5}"
        lab = labmod.up(load_cluster(CLUSTER), name=name)
        try:
            yield lab
        finally:
            labmod.down(name)


def dumps(lab) -> dict[str, dict]:
    """Every host's links, addresses, routes, rules, qdiscs and sysctls as iproute2 reports them."""
    return {h.name: host_dump(lab.netns(h.name), [n.name for n in h.nics] + ["lo"])
            for h in lab.cluster.hosts}


def agent_routes(lab, host: str) -> list[dict]:
    """The routes the agent owns on `host` (its protocol number, 76)."""
    return [r for r in ip_json(lab.netns(host), "-4", "route", "show", "table", "all")
            if r.get("protocol") == "76"]


def write_plan(tmp_path: Path, doc: dict, name: str = "plan.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)


def topoctl(*args: str) -> int:
    """`topoctl ARGS` in this process: its exit code."""
    return cli.main(list(args))
