"""`topoctl plan CLUSTER JOB -o PLAN` and `topoctl explain PLAN [--png FILE]`.

Exit codes: 0 ok, 1 bad input (every problem printed as `topoctl: FILE: yaml.path: message` by
the CLI's one error handler; nothing written). With --json one JSON document on stdout: what
was planned (and the plan itself unless -o wrote it to a file), or what explain showed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Annotated

import yaml
from pydantic import Field, TypeAdapter, ValidationError

from topoagent.cliutil import add_json, positive_int
from topoagent.protocol import EXIT_OK
from topoagent.state.host import StateError, load_yaml_file
from topoctl.cli.output import write_output
from topoctl.lab.emulated import lab_emulation
from topoctl.lab.netops import LabError
from topoctl.limits import MAX_PLAN_HOSTS
from topoctl.render.drawing import draw_png  # matplotlib itself loads only when drawing
from topoctl.render.explain import explain_text, layout_lines
from topoctl.render.validate import validate_plan
from topoctl.render.yamlout import dump
from topoctl.rollout.twophase import load_plan
from topoctl.spec.cluster import ClusterError, DirectFabric, SwitchedFabric
from topoctl.spec.cluster_load import cluster_problems, load_cluster, parse_cluster

VALIDATE_ALL_UP_TO = 256  # hosts; larger plans validate an evenly spread sample of 64 hosts


def dump_plan(doc: dict) -> str:
    """The plan as YAML text, in the project's canonical layout (stable key order)."""
    return dump(doc)


def _sample(doc: dict, mode: str) -> dict:
    """The plan, or for a large one with mode auto/sample an evenly spread sample of hosts."""
    hosts = doc["hosts"]
    if mode == "all" or (mode == "auto" and len(hosts) <= VALIDATE_ALL_UP_TO):
        return doc
    names = list(hosts)
    step = max(1, len(names) // 64)
    return doc | {"hosts": {h: hosts[h] for h in names[::step]},
                  "job": doc["job"] | {"processes": {}}}


def check_scale(cluster, max_hosts: int, source: str) -> None:
    """Refuse, before any search starts, a cluster larger than the planner handles."""
    n = len(cluster.hosts)
    if n > max_hosts:
        raise ClusterError([("hosts", f"{n} hosts: more than the planner's limit of "
                             f"{max_hosts} hosts (its searches would run for minutes and use "
                             f"gigabytes); plan a smaller cluster or raise the limit with "
                             f"--max-hosts {n} at your own risk")], source=source)


def _lab_cluster(path: str):
    """The cluster file as this machine's namespace lab emulates it (`--as-lab`): without
    sch_netem in the kernel the lab's cables have no latency and no loss, so the plan leaves
    them out too and says which it left out (`topoctl.lab.emulated`)."""
    if os.geteuid() != 0:
        raise LabError("topoctl plan --as-lab needs root (it asks the kernel what the lab can "
                       "emulate, in a throwaway network namespace)")
    cluster = load_cluster(path)  # checked as written: its errors name the file
    emulated, cleared = lab_emulation(load_yaml_file(path))
    if not cleared:
        return cluster
    print(f"topoctl: {path}: this kernel has no sch_netem, so the lab emulates no latency "
          f"or loss: planning without {', '.join(cleared)}", file=sys.stderr)
    return parse_cluster(emulated, path)


def progress_printer(t0: float):
    """The planner's progress lines on stderr (stdout holds the plan or the --json answer),
    with the seconds since `t0`: a first plan on a lab times for minutes."""
    def say(msg: str) -> None:
        print(f"topoctl plan [{time.perf_counter() - t0:5.0f} s] {msg}", file=sys.stderr,
              flush=True)
    return say


def cmd_plan(args: argparse.Namespace) -> int:
    """`topoctl plan`: load and check the cluster and job, plan, validate, write the plan."""
    # imported only when planning, so every other command starts fast (this module is
    # imported by every topoctl start-up): the planner (strategies, solvers, simulator) and
    # the job schema with the model catalog (torch, 1-2 s)
    from topoctl.planner import make_plan  # the planner, ~0.1 s beyond start-up
    from topoctl.spec.job import JobError, load_job  # the catalog: torch

    t0 = time.perf_counter()
    cluster = _lab_cluster(args.cluster) if args.as_lab else load_cluster(args.cluster)
    check_scale(cluster, args.max_hosts, args.cluster)
    job = load_job(args.job)
    try:
        doc, _ctx, evals = make_plan(cluster, job, use_cache=not args.no_cache,
                                     retime=args.retime, progress=progress_printer(t0))
    except JobError as e:  # the planner knows the YAML path, the CLI knows the file
        raise e.at(args.job) from None
    except ClusterError as e:
        raise e.at(args.cluster) from None
    if args.validate != "none":
        problems = validate_plan(_sample(doc, args.validate))
        if problems:  # a planner bug, not bad input: a traceback and a request to report it
            raise RuntimeError(f"the generated plan fails validation: {problems[:5]}")
    text = dump_plan(doc)
    to_file = bool(args.output and args.output != "-")
    if to_file:
        write_output(args.output, text)
    elif not args.json:
        sys.stdout.write(text)
    m = doc["metadata"]
    refused = m.get("refused", {})
    if args.json:  # what was planned; the plan itself too when it went to no file
        print(json.dumps({
            "ok": True, "job": job.name, "cluster": cluster.name, "strategy": m["strategy"],
            "predicted_iteration_time": m["prediction"]["iteration_time"],
            "bound_iteration_time": m["bound"]["iteration_time"], "hosts": len(doc["hosts"]),
            "seconds": round(time.perf_counter() - t0, 3),
            "output": args.output if to_file else None,
            **({"refused": refused} if refused else {}),
            "layout": m.get("layout"),
            **({} if to_file else {"plan": yaml.safe_load(text)})}))
        return EXIT_OK
    for msg in refused.values():  # the strategies that could not plan, each with its reason
        print(f"not planned: {msg}", file=sys.stderr)
    print(f"planned {job.name} on {cluster.name}: strategy {m['strategy']}, predicted "
          f"{m['prediction']['iteration_time'] * 1e3:.3f} ms/iteration (bound "
          f"{m['bound']['iteration_time'] * 1e3:.3f} ms), {len(doc['hosts'])} hosts, "
          f"{time.perf_counter() - t0:.2f} s", file=sys.stderr)
    for line in layout_lines(doc):  # degrees, memory per device, collectives
        print(line, file=sys.stderr)
    return EXIT_OK


def check_fabric(fabric, source: str) -> None:
    """A plan's `fabric` (the cabling explain draws) against the cluster file's fabric
    schema; ClusterError with YAML paths under `fabric`."""
    adapter = TypeAdapter(Annotated[DirectFabric | SwitchedFabric, Field(discriminator="kind")])
    try:
        adapter.validate_python(fabric)
    except ValidationError as e:
        probs = []
        for p, m in cluster_problems(e):
            for tag in ("direct", "switched"):  # pydantic's discriminator tag
                if p == tag or p.startswith(f"{tag}."):
                    p = p[len(tag) + 1:]
            probs.append((f"fabric.{p}" if p else "fabric", m))
        raise ClusterError(probs, source=source) from None


def cmd_explain(args: argparse.Namespace) -> int:
    """`topoctl explain`: per-host tables (and a PNG drawing) of a validated plan."""
    doc = load_plan(args.plan)  # read + validate, as apply does
    wanted = args.hosts.split(",") if args.hosts else None
    missing = [h for h in wanted or [] if h not in doc["hosts"]]
    if missing:
        raise StateError(f"no {', '.join(missing)} in this plan", "hosts", source=args.plan)
    check_fabric(doc["fabric"], args.plan)
    try:
        text = explain_text(doc, wanted)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as e:
        # the informational sections (metadata: predictions, bound, strategies; the job's
        # collective) are the planner's own and only their shape is validated: say which
        # section explain could not read instead of a traceback
        raise StateError(f"cannot summarise this plan: its informational sections are not "
                         f"as `topoctl plan` writes them ({type(e).__name__}: {e})",
                         "metadata", source=args.plan) from None
    if args.png:
        draw_png(doc, args.png)
    if args.json:  # what was shown, and the drawing written
        m = doc.get("metadata") or {}
        print(json.dumps({"ok": True, "plan": args.plan, "hosts": wanted or sorted(doc["hosts"]),
                          "strategy": m.get("strategy"), "prediction": m.get("prediction"),
                          "layout": m.get("layout"), "explain": text, "png": args.png},
                         default=str))
        return EXIT_OK
    print(text)
    if args.png:
        print(f"topology drawing: {args.png}", file=sys.stderr)
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl plan` and `topoctl explain` to the topoctl parser."""
    p = sub.add_parser("plan", help="compute a plan for a job on a cluster",
                       description="compute a plan for a job on a cluster",
                       epilog="example: topoctl plan cluster.yaml job.yaml -o plan.yaml")
    p.add_argument("cluster", help="cluster.yaml")
    p.add_argument("job", help="job.yaml")
    p.add_argument("-o", "--output", help="plan file to write (default: stdout)")
    add_json(p, "one JSON document on stdout: what was planned (the plan too, without -o)")
    p.add_argument("--no-cache", action="store_true",
                   help="no machine caches: re-measure op costs (pipeline strategies on lab "
                        "hosts then keep the roofline)")
    p.add_argument("--retime", action="store_true",
                   help="lab hosts: time the ranks' ops and the tree runtime's CPU costs "
                        "on this CPU again and cache them, instead of earlier timings (for a "
                        "machine whose speed varies; a few seconds more)")
    p.add_argument("--as-lab", action="store_true",
                   help="plan the cluster as this machine's `topoctl lab` emulates it (root): "
                        "latency and loss left out when the kernel has no sch_netem, so the "
                        "prediction is comparable with a lab run")
    p.add_argument("--max-hosts", type=positive_int, default=MAX_PLAN_HOSTS, metavar="N",
                   help="refuse clusters of more than N hosts up front (default "
                        f"{MAX_PLAN_HOSTS}: larger ones take the planner minutes and gigabytes)")
    p.add_argument("--validate", choices=["auto", "all", "sample", "none"], default="auto",
                   help="check hosts against the agent schema: all, an evenly spread sample of "
                        f"64, or none (auto: all up to {VALIDATE_ALL_UP_TO} hosts, else sample)")
    p.set_defaults(func=cmd_plan)
    e = sub.add_parser("explain", help="summarise a plan: per-host tables and topology",
                       description="summarise a plan: per-host tables and topology",
                       epilog="example: topoctl explain plan.yaml --hosts h0,h1 --png plan.png")
    e.add_argument("plan", help="plan.yaml")
    e.add_argument("--png", help="also draw the topology to this PNG file")
    e.add_argument("--hosts", help="only these hosts' tables (comma-separated)")
    add_json(e, "one JSON document on stdout: the plan's strategy, prediction and the tables")
    e.set_defaults(func=cmd_explain)
