"""What the Ansible end-to-end modules share beyond the 4-host lab (tests.e2e.labs): the lab's
inventory, the playbook runner and its per-host results."""

from __future__ import annotations

from pathlib import Path

from topoctl.cli.inventory import inventory_text, lab_inventory
from topoctl.rollout.ansible import run_playbook

ROOT = Path(__file__).resolve().parents[2]


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


def results(report) -> dict[str, str]:
    return {h: e.result for h, e in report.final().items()}

