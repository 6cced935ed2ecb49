"""`topoctl apply|diff --via ansible PLAN`: the same rollout through playbooks/apply.yml and
ansible-runner (diff: check mode), with the same progress lines and summary table.

The inventory: --inventory FILE, else one written from the lab (--lab, or the plan's cluster
when such a lab is up) or from --cluster FILE (hosts[].address), into the run's private data
directory (<state>/ansible/<cluster>; a lab's own state directory for a lab)."""

from __future__ import annotations

import argparse
from pathlib import Path

from topoagent.protocol import TopoError
from topoctl.cli.inventory import cluster_inventory, inventory_text, lab_inventory
from topoctl.lab.lab import Lab, list_labs
from topoctl.rollout import twophase as rollout
from topoctl.rollout.ansible import default_data_dir, run_playbook
from topoctl.rollout.twophase import Progress, Report
from topoctl.spec.cluster_load import load_cluster


def _inventory(args: argparse.Namespace, plan: dict) -> tuple[Path, Path]:
    """(inventory file, private data dir)."""
    cluster_name = plan["metadata"].get("cluster") or "cluster"
    lab_name = args.lab or cluster_name
    if args.inventory:
        data = default_data_dir(None, cluster_name)
        return Path(args.inventory).resolve(), data
    if args.lab or lab_name in list_labs():
        lab = Lab.load(lab_name)
        data, doc = lab.state_dir / "ansible", lab_inventory(lab)
    elif args.cluster:
        data, doc = default_data_dir(None, cluster_name), cluster_inventory(
            load_cluster(args.cluster))
    else:
        raise TopoError(f"no lab named {lab_name!r} is up: give --inventory FILE, --lab NAME "
                        "or --cluster FILE (host addresses)")
    path = data / "inventory" / "hosts.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(inventory_text(doc))
    return path, data


def run_via_ansible(args: argparse.Namespace, progress: Progress) -> Report:
    """The Report of the run; a TopoError (printed and mapped to exit 1 by the CLI's one error
    path) when it could not run."""
    try:
        plan = rollout.load_plan(args.plan)
        if args.hosts:
            rollout.host_texts(plan, args.hosts)  # names every host not in the plan
        inventory, data = _inventory(args, plan)
        extravars = {"topo_plan": str(Path(args.plan).resolve()),
                     "topo_force_mgmt": bool(args.force_mgmt), "topo_probe": not args.no_probe,
                     "topo_keep_going": bool(getattr(args, "keep_going", False))}
        if getattr(args, "confirm_within", None) is not None:  # apply.yml's default: 60 s
            extravars["topo_confirm_within"] = args.confirm_within
        report = run_playbook("apply.yml", inventory, private_data_dir=data, extravars=extravars,
                              limit=args.hosts, progress=progress, command=args.command,
                              check=args.command == "diff" or args.dry_run)
    except OSError as e:  # ansible-runner or the inventory file: say which, as bad input does
        raise TopoError(f"cannot run the playbook: {e}") from None
    return report
