"""`topoctl tag train`: train TAG's prior by self-play on the simulator.

    topoctl tag train [--rounds R] [--playouts P] [--epochs E] [--clusters C] [--seed S]
                      (-o weights.json | --install) [--png loss.png]

Searches generated 4-host clusters x catalog models (`topoctl.tag.train`), fits the GNN to the
searches' visit distributions, repeats; progress on stderr; writes the weights (JSON) to -o, or
with --install over the shipped prior (`topoctl/tag/weights.json`, what `tag.prior: gnn`
plans with), and a loss plot. Nothing is written into the installed package without --install.
Every argument is checked before the training starts (minutes of CPU): a folder that is missing
or not writable, an empty path or a seed out of range is an error at once. Retraining with the
same options reproduces the weights. Exit codes: 0 ok, 1 bad input."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import topoctl
from topoagent.cliutil import add_json
from topoagent.protocol import EXIT_OK, TopoError
from topoctl.cli.output import write_output

EXAMPLE = ("example: topoctl tag train --rounds 2 --playouts 300 --epochs 30 "
           "-o weights.json --png tag-loss.png")
MAX_SEED = 2**32 - 1  # seeds of the clusters (seed * 1000 + i), torch and the searches
# the installed package: written only with --install (the shipped prior lives there)
PACKAGE = Path(topoctl.__file__).resolve().parent
SHIPPED = PACKAGE / "tag" / "weights.json"  # topoctl.tag.prior.WEIGHTS, without its torch


def seed_arg(text: str) -> int:
    """argparse type: a seed in [0, MAX_SEED] (larger ones fail inside torch after the
    training has run)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a whole number in [0, {MAX_SEED}], "
                                         f"got {text!r}")
    return v


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
    t.add_argument("--seed", type=seed_arg, default=0,
                   help=f"seed of clusters and network, 0 to {MAX_SEED} (0)")
    out = t.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", metavar="FILE", help="where the weights go (JSON)")
    out.add_argument("--install", action="store_true",
                     help=f"replace the shipped prior ({SHIPPED.relative_to(PACKAGE.parent)}) "
                          "in the installed package")
    t.add_argument("--png", metavar="FILE", default="tag-loss.png",
                   help="loss plot (PNG; default tag-loss.png)")
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


def check_output(path: str, flag: str, install: bool = False) -> Path:
    """`path` as a file the verb may write: TopoError naming `flag` when it is empty, a
    folder, in a folder that is missing or not writable, or inside the installed package
    without `install` (the shipped prior is replaced by --install only)."""
    if not path.strip():
        raise TopoError("an empty path: name the file to write", source=flag)
    out = Path(path).expanduser()
    if out.is_dir():
        raise TopoError(f"{path} is a folder: name the file to write", source=flag)
    parent = out.resolve().parent
    if not parent.is_dir():
        raise TopoError(f"cannot write {path}: no folder {parent}", source=flag)
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and
                                                    not os.access(out, os.W_OK)):
        raise TopoError(f"cannot write {path}: permission denied", source=flag)
    if not install and out.resolve().is_relative_to(PACKAGE):
        raise TopoError(f"{path} is inside the installed package ({PACKAGE}): write the "
                        "shipped prior with --install, anything else elsewhere", source=flag)
    return out


def cmd_train(args: argparse.Namespace) -> int:
    """Check every argument, train, write the weights and the plot; EXIT_OK."""
    for flag in ("rounds", "playouts", "epochs", "clusters"):
        if getattr(args, flag) < 1:
            raise TopoError(f"must be at least 1, got {getattr(args, flag)}",
                            source=f"--{flag}")
    path = str(SHIPPED) if args.install else str(check_output(args.output, "-o"))
    if args.install:
        check_output(path, "--install", install=True)
    check_output(args.png, "--png")
    # torch, the planner and the catalog load only for this verb (CLI start-up stays quick)
    from topoctl.strategies.tag import kit as tag_kit  # the planner's strategies
    from topoctl.tag import train
    from topoctl.tag.gnn import to_plain  # torch
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"tag train [{time.perf_counter() - t0:5.0f} s] {msg}", file=sys.stderr,
              flush=True)

    say(f"capturing {args.clusters} clusters x {len(train.TRAIN_MODELS)} models")
    ctxs = contexts(train.case_docs(args.clusters, args.seed))
    out = train.self_play(ctxs, tag_kit(), args.rounds, args.playouts, args.epochs, args.seed,
                          say)
    doc = {"trained": {"rounds": args.rounds, "playouts": args.playouts,
                       "epochs": args.epochs, "clusters": args.clusters, "seed": args.seed,
                       "models": [m for m, _ in train.TRAIN_MODELS],
                       "hosts": train.TRAIN_HOSTS, "samples": out.samples,
                       "final_loss": out.losses[-1]},
           "weights": to_plain(out.net)}
    write_output(path, json.dumps(doc, separators=(",", ":")) + "\n",
                 "--install" if args.install else "-o")
    train.loss_png(out.losses, args.rounds, args.png)
    say(f"wrote {path} and {args.png}")
    if getattr(args, "json", False):
        print(json.dumps({"ok": True, "weights": path, "png": args.png,
                          "losses": out.losses}))
    else:
        print(f"weights: {path}\nloss plot: {args.png}\nfinal loss: {out.losses[-1]:.4f}")
    return EXIT_OK
