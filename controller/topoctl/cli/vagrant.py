"""`topoctl vagrant cluster.yaml -o vagrant/Vagrantfile`: the cluster as libvirt VMs
(topoctl.render.vagrant), provisioned with playbooks/site.yml."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from topoagent.protocol import EXIT_ERROR, EXIT_OK, TopoError
from topoctl.render.vagrant import vagrantfile
from topoctl.spec.cluster_load import load_cluster

ROOT = Path(__file__).resolve().parents[3]


def run(args: argparse.Namespace) -> int:
    """Write the cluster's Vagrantfile (cabled as --plan says, if given); exit 0, or a TopoError."""
    try:
        cluster = load_cluster(args.cluster)
        if args.plan:
            from topoctl.rollout.twophase import load_plan

            plan = load_plan(args.plan)
            if plan.get("fabric"):
                cluster = cluster.with_fabric(plan["fabric"], prefix=f"{args.plan}: fabric")
    except (TopoError, OSError) as e:
        for p, m in getattr(e, "problems", None) or [("", str(e))]:
            print(f"error: {p}: {m}" if p else f"error: {m}", file=sys.stderr)
        return EXIT_ERROR
    out_dir = Path(args.output).resolve().parent if args.output not in (None, "-") else Path.cwd()
    text = vagrantfile(cluster, source=args.cluster, box=args.box, cpus=args.cpus,
                       memory=args.memory,
                       playbooks=os.path.relpath(ROOT / "playbooks", out_dir),
                       wheels=os.path.relpath(ROOT / "dist" / "wheels", out_dir))
    if args.output in (None, "-"):
        print(text, end="")
    else:
        Path(args.output).write_text(text)
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
