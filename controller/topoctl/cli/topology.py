"""`topoctl topology --hosts N --degree D [--group-sizes G,...] [--json]`: the direct-connect
cabling TopoOpt's TopologyFinder picks for n servers with d ports, to inspect before cabling.

Prints the ring strides (and what the authors' geometric rule would pick), the port-to-port
links, the diameter and the mean hop count. Exit codes: 0 ok, 1 bad input (a TopoError naming
the flag, printed by the CLI's one error path)."""

from __future__ import annotations

import argparse
import json

from topoagent.cliutil import add_json
from topoagent.protocol import EXIT_OK, TopoError
from topoctl.topoopt.totient import geometric_strides, score


def _sizes(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    return out


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl topology` to the topoctl parser."""
    text = ("the direct-connect topology TopoOpt picks for n servers with d ports (strides, "
            "links, diameter)")
    p = sub.add_parser("topology", help=text, description=text,
                       epilog="example: topoctl topology --hosts 8 --degree 4")
    p.add_argument("--hosts", "-n", type=int, required=True, help="servers (n)")
    p.add_argument("--degree", "-d", type=int, required=True, help="ports cabled per server")
    p.add_argument("--ports", type=int, help="ports a server has (default: the degree)")
    p.add_argument("--group-sizes", type=_sizes, default=None, metavar="G,G",
                   help="AllReduce group sizes (each divides n; default n): one ring each")
    add_json(p)
    p.set_defaults(func=cmd_topology)


def cmd_topology(args: argparse.Namespace) -> int:
    """Print (or with --json, dump) the TopologyFinder's cabling for --hosts and --degree;
    EXIT_OK, or a TopoError naming the flag for bad input (exit 1 through the CLI)."""
    # networkx (~0.4 s) loads only for this verb: every topoctl start-up imports this module
    from topoctl.topoopt.topology import ArGroup, find_topology

    sizes = args.group_sizes or ([args.hosts] if args.hosts >= 2 else [])
    for g in sizes:
        if g < 2 or args.hosts < 2 or g > args.hosts or args.hosts % g:
            raise TopoError(f"{g} cannot be laid out on {args.hosts} servers (a group size "
                            f"divides n and is at least 2)", source="--group-sizes")
    t = find_topology(args.hosts, args.degree, [ArGroup(g, 1.0) for g in sizes],
                      ports=args.ports, require_rings=True)
    geo = geometric_strides(t.n, t.allreduce_degree // 2) if sizes == [t.n] else []
    doc = t.to_dict()
    out = {"hosts": t.n, "degree": t.d, "strides": t.strides,
           "rings": doc["rings"], "diameter": t.diameter, "mean_hops": doc["mean_hops"],
           "links": [{"a": f"h{c.a}:p{c.a_port}", "b": f"h{c.b}:p{c.b_port}", "kind": c.kind}
                     | ({"stride": c.stride} if c.kind == "ring" else {}) for c in t.cables]}
    if geo:
        gs = score(t.n, geo)
        out["geometric"] = {"strides": geo, "diameter": gs.diameter,
                            "mean_hops": round(gs.mean_hops, 6)}
    if args.json:
        print(json.dumps(out, indent=1))
        return EXIT_OK
    print(f"{t.n} servers, {t.d} ports each: rings with strides {t.strides} "
          f"({t.allreduce_degree} ports), diameter {t.diameter}, mean hops {t.mean_hops:.3f}")
    if geo:
        g = out["geometric"]
        print(f"  (the authors' geometric rule: strides {geo}, diameter {g['diameter']}, "
              f"mean hops {g['mean_hops']:.3f})")
    for size, st in sorted(t.ring_groups.items(), key=lambda kv: -kv[0]):
        print(f"  groups of {size}: strides {st}")
    print("links (port-to-port):")
    for ln in out["links"]:
        tag = f"ring stride {ln['stride']}" if ln["kind"] == "ring" else ln["kind"]
        print(f"  {ln['a']:>10} -- {ln['b']:<10} {tag}")
    return EXIT_OK
