"""`topoctl trees`: pack spanning trees for AllReduce over a measured bandwidth matrix.

    topoctl trees --edges FILE [--workers LIST] [--max-trees K] [--json] [-o SCHEDULE]

FILE has one full-duplex link per line, ``u v capacity`` (capacity per direction, any unit);
nodes not in ``--workers`` are switches that only forward. ``-o/--output`` writes the runtime's
tree schedule (YAML). The verb was called ``sync`` (read as "apply" by kubectl and Argo users):
``topoctl sync`` still works, hidden from the help, with a deprecation line on stderr, and
``--schedule`` is a hidden alias of ``--output``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import yaml

from topoagent.cliutil import add_json
from topoagent.protocol import EXIT_OK
from topoagent.state.host import StateError, read_text
from topoctl.cli.output import write_output
from topoctl.collective.trees.bounds import best_bound, tree_bounds
from topoctl.collective.trees.pack import plan_trees
from topoctl.collective.trees.schedule import plan_to_json, plan_to_schedule
from topoctl.fabric.capgraph import FabricError, build_capgraph, read_edges

HELP = "pack spanning trees for AllReduce over a capacitated fabric"
EXAMPLE = "example: topoctl trees --edges links.txt --workers a,b,c -o schedule.yaml"
DEPRECATED = "`topoctl sync` is now `topoctl trees`; the old name goes in the next release"
DESCRIPTION = f"""{HELP}.

--edges FILE has one full-duplex link per line, `u v capacity` (capacity per direction,
any unit); nodes not in --workers are switches that only forward. -o writes the tree
schedule the training runtime reads."""


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl trees` to the topoctl parser, and `sync`, its old name, hidden."""
    _add(sub, "trees", run, help=HELP, description=DESCRIPTION)
    # the old name: no `help`, so argparse leaves it out of the verb list
    _add(sub, "sync", run_deprecated, description=f"{DEPRECATED}.\n\n{DESCRIPTION}")


def _add(sub: argparse._SubParsersAction, name: str, func, **kw) -> None:
    p = sub.add_parser(name, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter, **kw)
    p.add_argument("--edges", required=True, metavar="FILE", help="'u v capacity' per line")
    p.add_argument("--workers", metavar="LIST", help="comma-separated workers (default: all)")
    p.add_argument("--max-trees", type=int, metavar="K",
                   help="keep at most K trees (default: as many as the optimum needs, 16-256)")
    add_json(p, "print JSON")
    p.add_argument("-o", "--output", metavar="FILE", help="write the runtime schedule (YAML)")
    p.add_argument("--schedule", dest="output", help=argparse.SUPPRESS)  # the old name
    p.add_argument("--chunk-bytes", type=int, default=262144, help="schedule chunk size")
    p.set_defaults(func=func)


def run_deprecated(args: argparse.Namespace) -> int:
    """`topoctl sync`: the old name of `topoctl trees`, one deprecation line on stderr."""
    print(f"topoctl: {DEPRECATED}", file=sys.stderr)
    return run(args)


def pack(edges_text: str, workers: list[str] | None, max_trees: int | None) -> tuple[dict, object]:
    """Plan and bound; returns (document for --json, TreePlan)."""
    g = build_capgraph(read_edges(edges_text.splitlines()), workers)
    plan = plan_trees(g, max_trees=max_trees)
    t0 = time.perf_counter()
    bounds = tree_bounds(g, lp_upper=plan.upper_bound)
    name, optimum = best_bound(bounds)
    doc = {
        "trees": [
            {k: t[k] for k in ("root", "edges", "paths", "rate")} for t in plan_to_json(plan, g)
        ],
        "rate": plan.rate,
        "optimum": optimum,
        "bound": name,
        "seconds": plan.seconds,
        "achieved_over_optimal": plan.rate / optimum,
        "lp_optimum": plan.lp_optimum,
        "bounds": bounds,
        "bounds_seconds": time.perf_counter() - t0,
        "workers": [str(g.nodes[w]) for w in g.workers],
        "cut_short": plan.cut_short,  # steps the wall-clock safety limit stopped (normally [])
    }
    return doc, plan


def run(args: argparse.Namespace) -> int:
    """`topoctl trees`: read the edges, pack trees, print (or --json) and write the schedule."""
    text = read_text(args.edges)
    workers = [w for w in args.workers.split(",") if w] if args.workers else None
    if args.max_trees is not None and args.max_trees < 1:
        raise StateError("must be >= 1", source="--max-trees")
    if args.chunk_bytes < 1:  # the schedule's own check would only fire after planning
        raise StateError(f"must be >= 1, got {args.chunk_bytes}", source="--chunk-bytes")
    try:
        doc, plan = pack(text, workers, args.max_trees)
    except FabricError as e:
        raise e.at(args.edges) from None
    if args.output:
        sched = plan_to_schedule(
            plan,
            chunk_bytes=args.chunk_bytes,
            metadata={"workers": doc["workers"], "optimum": doc["optimum"], "bound": doc["bound"]},
        )
        write_output(args.output, yaml.safe_dump(sched.dump(), sort_keys=False), "--output")
    if args.json:
        print(json.dumps(doc | {"output": args.output}, indent=1))
        return EXIT_OK
    nw, nt = len(doc["workers"]), len(plan.trees)
    print(f"{nw} workers, {nt} trees, planned in {plan.seconds:.2f} s")
    print(f"{'root':>10} {'rate':>12} {'share':>7} {'height':>6} {'routed edges':>12}")
    for t, tj in zip(plan.trees, doc["trees"], strict=True):
        share = t.rate / plan.rate
        routed = len(tj["paths"]) // 2
        print(f"{tj['root']:>10} {t.rate:>12.6g} {share:>7.1%} {t.height:>6} {routed:>12}")
    print(f"rate {plan.rate:.6g}  (time per unit of data {1 / plan.rate:.6g})")
    print(f"optimum {doc['optimum']:.6g} ({doc['bound']}): achieved/optimal "
          f"{doc['achieved_over_optimal']:.2%}")
    for k, v in doc["bounds"].items():
        if v is not None and math.isfinite(v):
            print(f"  {k:<22} {v:.6g}")
    return EXIT_OK
