"""What the Ansible end-to-end modules share: the 4-host lab they run against (one per module),
its inventory, the playbook runner and the readers of host state (iproute2 through
tests.netns)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.labs import CLUSTER, HOSTS, PLAN  # noqa: F401 (HOSTS, PLAN: for the modules)
from tests.netns import host_dump, ip_json
from topoctl.cli.inventory import inventory_text, lab_inventory
from topoctl.lab import lab as labmod
from topoctl.rollout.ansible import run_playbook
from topoctl.spec.cluster_load import load_cluster

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def ansible_lab(tmp_path_factory, prefix: str) -> Iterator[labmod.Lab]:
    """The 4-host lab (ring4) under a fresh lab directory, named `prefix` + this process's
    pid (each test module its own lab, so the modules can run side by side), always torn down."""
    root = tmp_path_factory.mktemp("labs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPOCTL_LAB_DIR", str(root))
        name = f"{prefix}{os.getpid() % 10**5}"
        lab = labmod.up(load_cluster(CLUSTER), name=name)
        try:
            yield lab
        finally:
            labmod.down(name)


def lab_inventory_file(lab) -> Path:
    """`topoctl inventory --lab`'s inventory of `lab`, written into the lab's directory."""
    path = lab.state_dir / "test-inventory.yml"
    path.write_text(inventory_text(lab_inventory(lab)))
    return path


def inventory_with(lab, tmp_path: Path, host_vars: dict[str, dict]) -> Path:
    doc = lab_inventory(lab)
    for h, v in host_vars.items():
        doc["all"]["hosts"].setdefault(h, {}).update(v)
    path = tmp_path / "inventory.yml"
    path.write_text(inventory_text(doc))
    return path


def run(lab, inventory: Path, playbook: str, **kw):
    return run_playbook(playbook, inventory, private_data_dir=lab.state_dir / "ansible", **kw)


def dumps(lab) -> dict[str, dict]:
    return {h.name: host_dump(lab.netns(h.name), [n.name for n in h.nics] + ["lo"])
            for h in lab.cluster.hosts}


def agent_routes(lab, host: str) -> list[dict]:
    return [r for r in ip_json(lab.netns(host), "-4", "route", "show", "table", "all")
            if r.get("protocol") == "76"]


def results(report) -> dict[str, str]:
    return {h: e.result for h, e in report.final().items()}


def write_plan(tmp_path: Path, doc: dict, name: str = "plan.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)
