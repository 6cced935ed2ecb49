"""`topoctl export nccl PLAN -o DIR [--cluster FILE]`: what NCCL needs on each host to run the
plan's collectives (`topoctl.render.nccl`): per rank an environment file, per host an NCCL
topology file, and the MSCCL programs of the planned AllReduce, checked against the executor's
limits. Files:

    DIR/ranks.yaml                    plan rank -> NCCL rank (NCCL's ring = the planned ring)
    DIR/<host>/rank<L>.env            KEY=VALUE for local rank L (RANK, NCCL_*, MSCCL_*)
    DIR/<host>/topo.xml               NCCL_TOPO_FILE
    DIR/<host>/msccl/<name>.xml       MSCCL_ALGO_DIR / MSCCL_XML_FILES

Exit codes: 0 written, 1 bad input or a program over the executor's limits (named)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from topoagent.cliutil import add_json
from topoagent.protocol import EXIT_OK
from topoagent.state.host import StateError
from topocontract.msccl import Limits
from topoctl.cli.output import write_output

EXAMPLE = """example: topoctl export nccl plan.yaml --cluster cluster.yaml -o nccl/
  then on each host, with nccl/<host> copied to /etc/topoctl/nccl/<host>, per local rank L:
  set -a; . /etc/topoctl/nccl/$(hostname)/rank$L.env; set +a; python train.py"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl export nccl` to the topoctl parser."""
    text = "write what NCCL needs to run the plan's collectives (env, topology, MSCCL programs)"
    p = sub.add_parser("export", help=text, description=text, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("format", choices=["nccl"], help="what to export for (nccl)")
    p.add_argument("plan", help="plan file (topoctl plan -o)")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="directory to write into (created)")
    p.add_argument("--cluster", metavar="FILE",
                   help="the cluster file: device types and NIC speeds for the topology files")
    p.add_argument("--remote-dir", default="/etc/topoctl/nccl", metavar="PATH",
                   help="where DIR/<host> will be on each host (paths in the env files)")
    p.add_argument("--max-steps", type=int, default=Limits().max_steps, metavar="N",
                   help="the executor's MSCCL_MAX_NUM_STEPS (default %(default)s, its build "
                        "default)")
    add_json(p)
    p.set_defaults(func=cmd_export)


def _write_files(out: Path, export, files: dict[str, str]) -> list[str]:
    written = [str(out / "ranks.yaml")]
    out.mkdir(parents=True, exist_ok=True)
    write_output(written[0], yaml.safe_dump({"nccl_rank": export.ranks}, sort_keys=True))
    for host, hx in sorted(export.hosts.items()):
        (out / host / "msccl").mkdir(parents=True, exist_ok=True)
        for local, env in sorted(hx.rank_env.items()):
            path = out / host / f"rank{local}.env"
            write_output(str(path), "".join(f"{k}={v}\n" for k, v in env.items()))
            written.append(str(path))
        write_output(str(out / host / "topo.xml"), hx.topo_xml)
        written.append(str(out / host / "topo.xml"))
        for name, text in files.items():
            write_output(str(out / host / "msccl" / name), text)
            written.append(str(out / host / "msccl" / name))
    return written


def cmd_export(args: argparse.Namespace) -> int:
    """Write the NCCL export of `args.plan` into `args.output`."""
    # the plan loader, cluster schema and renderer load only for this verb: `topoctl --help`
    # imports every verb module
    from topoctl.render.nccl import export_nccl, program_files  # (see above)
    from topoctl.rollout.twophase import load_plan  # (see above)
    from topoctl.spec.cluster_load import load_cluster  # (see above)

    if args.max_steps < 1:
        raise StateError([("--max-steps", "must be at least 1")])
    plan = load_plan(args.plan)
    cluster = load_cluster(args.cluster) if args.cluster else None
    export = export_nccl(plan, cluster, args.remote_dir.rstrip("/"),
                         Limits(max_steps=args.max_steps))
    files = program_files(export)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise StateError([("-o", f"{out} exists and is not a directory")])
    written = _write_files(out, export, files)
    summary = {"output": str(out), "hosts": len(export.hosts), "ranks": len(export.ranks),
               "programs": {n: {"channels": p.nchannels, "ngpus": p.ngpus,
                                "max_steps": max(len(tb.steps) for g in p.gpus for tb in g.tbs)}
                            for n, p in export.programs.items()},
               "notes": export.notes, "files": written}
    if args.json:
        print(json.dumps(summary, indent=1))
        return EXIT_OK
    progs = ", ".join(f"{n} ({d['channels']} channel(s), at most {d['max_steps']} steps a "
                      "thread block)" for n, d in summary["programs"].items()) or "none"
    print(f"wrote {len(written)} files for {summary['hosts']} hosts, {summary['ranks']} ranks "
          f"into {out}: MSCCL programs {progs}")
    for note in export.notes:
        print(f"  {note}")
    return EXIT_OK
