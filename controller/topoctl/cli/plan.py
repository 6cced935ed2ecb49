"""`topoctl plan CLUSTER JOB -o PLAN` and `topoctl explain PLAN [--png FILE]`.

Exit codes: 0 ok, 2 bad input (every problem printed as `FILE: yaml.path: message`; nothing
written)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from topoagent.state import StateError
from topoctl.render.validate import validate_plan
from topoctl.render.yamlout import dump
from topoctl.rollout.twophase import load_plan
from topoctl.spec.cluster import ClusterError
from topoctl.spec.cluster_load import load_cluster

VALIDATE_ALL_UP_TO = 256  # hosts; larger plans validate an evenly spread sample of 64 hosts


def dump_plan(doc: dict) -> str:
    return dump(doc)


def _sample(doc: dict, mode: str) -> dict:
    hosts = doc["hosts"]
    if mode == "all" or (mode == "auto" and len(hosts) <= VALIDATE_ALL_UP_TO):
        return doc
    names = list(hosts)
    step = max(1, len(names) // 64)
    return doc | {"hosts": {h: hosts[h] for h in names[::step]},
                  "job": doc["job"] | {"processes": {}}}


def _fail(source: str, err: StateError) -> int:
    for path, msg in err.problems:
        print(f"{source}: {path}: {msg}" if path else f"{source}: {msg}", file=sys.stderr)
    return 2


def cmd_plan(args: argparse.Namespace) -> int:
    # torch and the catalog: imported only when planning, so every other command starts fast
    from topoctl.planner import make_plan
    from topoctl.spec.job import JobError, load_job

    t0 = time.perf_counter()
    try:
        cluster = load_cluster(args.cluster)
    except ClusterError as e:
        return _fail(args.cluster, e)
    try:
        job = load_job(args.job)
    except JobError as e:
        return _fail(args.job, e)
    try:
        doc, _ctx, evals = make_plan(cluster, job, use_cache=not args.no_cache)
    except JobError as e:
        return _fail(args.job, e)
    except ClusterError as e:
        return _fail(args.cluster, e)
    if args.validate != "none":
        problems = validate_plan(_sample(doc, args.validate))
        if problems:  # a planner bug, not bad input: say so loudly
            return _fail("generated plan (planner bug)", StateError(problems))
    text = dump_plan(doc)
    if args.output and args.output != "-":
        out = Path(args.output)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(out)
    else:
        sys.stdout.write(text)
    m = doc["metadata"]
    print(f"planned {job.name} on {cluster.name}: strategy {m['strategy']}, predicted "
          f"{m['prediction']['iteration_time'] * 1e3:.3f} ms/iteration (bound "
          f"{m['bound']['iteration_time'] * 1e3:.3f} ms), {len(doc['hosts'])} hosts, "
          f"{time.perf_counter() - t0:.2f} s", file=sys.stderr)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from topoctl.render.explain import explain_text

    try:
        doc = load_plan(args.plan)  # read + validate, as apply does
    except StateError as e:
        return _fail(args.plan, e)
    wanted = args.hosts.split(",") if args.hosts else None
    missing = [h for h in wanted or [] if h not in doc["hosts"]]
    if missing:
        print(f"{args.plan}: hosts: no {', '.join(missing)} in this plan", file=sys.stderr)
        return 2
    print(explain_text(doc, wanted))
    if args.png:
        from topoctl.render.drawing import draw_png

        draw_png(doc, args.png)
        print(f"topology drawing: {args.png}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="compute a plan for a job on a cluster")
    p.add_argument("cluster", help="cluster.yaml")
    p.add_argument("job", help="job.yaml")
    p.add_argument("-o", "--output", help="plan file to write (default: stdout)")
    p.add_argument("--no-cache", action="store_true", help="re-measure op costs")
    p.add_argument("--validate", choices=["auto", "all", "sample", "none"], default="auto",
                   help="check hosts against the agent schema: all, an evenly spread sample of "
                        f"64, or none (auto: all up to {VALIDATE_ALL_UP_TO} hosts, else sample)")
    p.set_defaults(func=cmd_plan)
    e = sub.add_parser("explain", help="summarise a plan: per-host tables and topology")
    e.add_argument("plan", help="plan.yaml")
    e.add_argument("--png", help="also draw the topology to this PNG file")
    e.add_argument("--hosts", help="only these hosts' tables (comma-separated)")
    e.set_defaults(func=cmd_explain)
