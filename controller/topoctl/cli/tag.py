"""`topoctl tag train`: train TAG's prior by self-play on the simulator.

    topoctl tag train [--rounds R] [--playouts P] [--epochs E] [--clusters C] [--seed S]
                      [-o weights.json] [--png loss.png]

Searches generated 4-host clusters x catalog models (`topoctl.tag.train`), fits the GNN to the
searches' visit distributions, repeats; progress on stderr; writes the weights (JSON: the
shipped file by default, `topoctl/tag/weights.json`) and a loss plot. Retraining with the same
options reproduces the weights. Exit codes: 0 ok, 1 bad input."""

from __future__ import annotations

import argparse
import json
import sys
import time

from topoagent.cliutil import add_json
from topoagent.protocol import EXIT_OK, TopoError

EXAMPLE = ("example: topoctl tag train --rounds 2 --playouts 300 --epochs 30 "
           "-o weights.json --png tag-loss.png")


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl tag` (with `train`) to the topoctl parser."""
    text = "TAG's search prior: train it by self-play on the simulator"
    p = sub.add_parser("tag", help=text, description=text, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="tag_command", metavar="COMMAND", required=True)
    t = verbs.add_parser("train", help="self-play training; writes weights and a loss plot",
                         description=__doc__, epilog=EXAMPLE,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--rounds", type=int, default=2, help="search + fit rounds (default 2)")
    t.add_argument("--playouts", type=int, default=300, help="playouts per search (300)")
    t.add_argument("--epochs", type=int, default=30, help="epochs per round (30)")
    t.add_argument("--clusters", type=int, default=6, help="generated clusters (6)")
    t.add_argument("--seed", type=int, default=0, help="seed of clusters and network (0)")
    t.add_argument("-o", "--output", metavar="FILE", help="weights (default: the shipped file)")
    t.add_argument("--png", metavar="FILE", default="tag-loss.png", help="loss plot (PNG)")
    add_json(t)
    t.set_defaults(func=cmd_train)


def contexts(docs: list[tuple[dict, dict]]) -> list:
    """The planner contexts of the training cases, (cluster doc, job doc) pairs (roofline,
    no caches): built here so that `topoctl.tag` never imports the planner."""
    # the planner and the catalog (torch) load only for this verb: CLI start-up stays quick
    from topoctl.planner import prepare
    from topoctl.spec.cluster_load import parse_cluster  # with the planner
    from topoctl.spec.job import parse_job  # with the planner
    return [prepare(parse_cluster(c), parse_job(j), use_cache=False) for c, j in docs]


def cmd_train(args: argparse.Namespace) -> int:
    """Train, write the weights and the plot; EXIT_OK."""
    for flag in ("rounds", "playouts", "epochs", "clusters"):
        if getattr(args, flag) < 1:
            raise TopoError(f"must be at least 1, got {getattr(args, flag)}",
                            source=f"--{flag}")
    # torch, the planner and the catalog load only for this verb (CLI start-up stays quick)
    from topoctl.strategies.tag import kit as tag_kit  # the planner's strategies
    from topoctl.tag import train
    from topoctl.tag.gnn import to_plain  # torch
    from topoctl.tag.prior import WEIGHTS  # torch
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"tag train [{time.perf_counter() - t0:5.0f} s] {msg}", file=sys.stderr,
              flush=True)

    say(f"capturing {args.clusters} clusters x {len(train.TRAIN_MODELS)} models")
    ctxs = contexts(train.case_docs(args.clusters, args.seed))
    out = train.self_play(ctxs, tag_kit(), args.rounds, args.playouts, args.epochs, args.seed,
                          say)
    path = args.output or str(WEIGHTS)
    doc = {"trained": {"rounds": args.rounds, "playouts": args.playouts,
                       "epochs": args.epochs, "clusters": args.clusters, "seed": args.seed,
                       "models": [m for m, _ in train.TRAIN_MODELS],
                       "hosts": train.TRAIN_HOSTS, "samples": out.samples,
                       "final_loss": out.losses[-1]},
           "weights": to_plain(out.net)}
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    train.loss_png(out.losses, args.rounds, args.png)
    say(f"wrote {path} and {args.png}")
    if getattr(args, "json", False):
        print(json.dumps({"ok": True, "weights": path, "png": args.png,
                          "losses": out.losses}))
    else:
        print(f"weights: {path}\nloss plot: {args.png}\nfinal loss: {out.losses[-1]:.4f}")
    return EXIT_OK
