"""`topoctl vagrant cluster.yaml -o vagrant/Vagrantfile`: the cluster as libvirt VMs
(topoctl.render.vagrant), provisioned with playbooks/site.yml."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from topoagent.protocol import EXIT_OK, TopoError
from topoctl.cli.output import write_output
from topoctl.render.vagrant import vagrantfile
from topoctl.rollout.twophase import load_plan
from topoctl.spec.cluster_load import load_cluster

ROOT = Path(__file__).resolve().parents[3]


def run(args: argparse.Namespace) -> int:
    """Write the cluster's Vagrantfile (cabled as --plan says, if given); exit 0, or a TopoError
    (printed as `topoctl: FILE: yaml.path: message` by the CLI, like every verb)."""
    if args.cpus < 1 or args.memory < 256:  # a VM libvirt would refuse at `vagrant up`
        raise TopoError(f"expected --cpus >= 1 and --memory >= 256 (MiB), got {args.cpus} and "
                        f"{args.memory}", source="--cpus/--memory")
    cluster = load_cluster(args.cluster)
    if args.plan:
        plan = load_plan(args.plan)
        if plan.get("fabric"):
            try:
                cluster = cluster.with_fabric(plan["fabric"])
            except TopoError as e:
                raise e.at(args.plan) from None
    out_dir = Path(args.output).resolve().parent if args.output not in (None, "-") else Path.cwd()
    try:
        text = vagrantfile(cluster, source=args.cluster, box=args.box, cpus=args.cpus,
                           memory=args.memory,
                           playbooks=os.path.relpath(ROOT / "playbooks", out_dir),
                           wheels=os.path.relpath(ROOT / "dist" / "wheels", out_dir))
    except TopoError as e:  # what the cluster file asks and a VM cannot do: name the file
        raise e.at(args.cluster) from None
    if args.output in (None, "-"):
        print(text, end="")
    else:
        write_output(args.output, text)
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl vagrant` to the topoctl parser."""
    text = "write a libvirt Vagrantfile: one VM per host, cables as UDP tunnels"
    p = sub.add_parser("vagrant", help=text, description=text)
    p.add_argument("cluster", help="cluster.yaml")
    p.add_argument("-o", "--output", help="Vagrantfile to write (default stdout)")
    p.add_argument("--plan", help="cable as this plan's fabric says")
    p.add_argument("--box", default="debian/bookworm64")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--memory", type=int, default=2048, help="MiB per VM")
    p.set_defaults(func=run)
