"""`topoctl vagrant cluster.yaml -o vagrant/Vagrantfile`: the cluster as libvirt VMs
(topoctl.render.vagrant), provisioned with playbooks/site.yml."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from topoagent.cliutil import add_json
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
    to_file = args.output not in (None, "-")
    if to_file:
        write_output(args.output, text)
    if args.json:  # what was written (the Vagrantfile itself too when it went to no file)
        print(json.dumps({"ok": True, "output": args.output if to_file else None,
                          "vms": [h.name for h in cluster.hosts], "box": args.box,
                          "cpus": args.cpus, "memory_mib": args.memory, "plan": args.plan,
                          **({} if to_file else {"vagrantfile": text})}))
    elif not to_file:
        print(text, end="")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl vagrant` to the topoctl parser."""
    text = "write a libvirt Vagrantfile: one VM per host, cables as UDP tunnels"
    p = sub.add_parser("vagrant", help=text, description=text,
                       epilog="example: topoctl vagrant cluster.yaml --plan plan.yaml -o "
                              "vagrant/Vagrantfile")
    p.add_argument("cluster", help="cluster.yaml")
    p.add_argument("-o", "--output", help="Vagrantfile to write (default stdout)")
    p.add_argument("--plan", help="cable as this plan's fabric says")
    p.add_argument("--box", default="debian/bookworm64")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--memory", type=int, default=2048, help="MiB per VM")
    add_json(p, "one JSON document on stdout: the VMs written (the Vagrantfile too, without "
                "-o)")
    p.set_defaults(func=run)
