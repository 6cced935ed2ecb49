"""`topoctl` command line. Each command group lives in its own module and registers itself
here through `COMMANDS`: a module with `register(subparsers)` that sets `func` on its parsers."""

from __future__ import annotations

import argparse
import importlib
import sys

# module paths, each with register(subparsers); add a line per command group
COMMANDS: list[str] = [
    "topoctl.cli.apply",
    "topoctl.cli.bench",
    "topoctl.cli.inventory",
    "topoctl.cli.lab",
    "topoctl.cli.plan",
    "topoctl.cli.run",
    "topoctl.cli.sync",
    "topoctl.cli.vagrant",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topoctl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMANDS:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # only pass-through verbs (bench) take arguments they do not declare
        if not hasattr(args, "args"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.args = [*extra, *args.args]
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
