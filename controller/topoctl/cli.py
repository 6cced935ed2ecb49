"""`topoctl` command line. Each command group lives in its own module and registers itself
here through `COMMANDS`: a module with `register(subparsers)` that sets `func` on its parsers."""

from __future__ import annotations

import argparse
import importlib
import sys

# module paths, each with register(subparsers); add a line per command group
COMMANDS: list[str] = [
    "topoctl.cli_apply",
    "topoctl.cli_bench",
    "topoctl.cli_lab",
    "topoctl.cli_plan",
    "topoctl.cli_run",
    "topoctl.cli_sync",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="topoctl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMANDS:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
