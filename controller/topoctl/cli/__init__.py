"""`topoctl` command line. Each command group lives in its own module and registers itself
here through `COMMANDS`: a module with `register(subparsers)` that sets `func` on its parsers.

Errors: a verb raises a `TopoError` (topoagent.protocol) for anything expected (bad input, an
unreachable host); `main` is the one place that maps it to `topoctl: FILE: yaml.path: message`
and exit 1; any other exception is a bug (traceback, a line asking to report it, exit 70).
Exit codes are the protocol's for every verb (README "Exit codes"). Helpers the verb modules
share live in `topoctl.cli.output`: verb modules never import this package's `__init__`."""

from __future__ import annotations

import argparse
import importlib
import sys

from topoagent.cliutil import ArgumentParser, run_guarded
from topoagent.protocol import EXIT_ERROR

# module paths, each with register(subparsers); add a line per command group
COMMANDS: list[str] = [
    "topoctl.cli.apply",
    "topoctl.cli.bench",
    "topoctl.cli.inventory",
    "topoctl.cli.lab",
    "topoctl.cli.plan",
    "topoctl.cli.run",
    "topoctl.cli.sync",
    "topoctl.cli.topology",
    "topoctl.cli.vagrant",
]


def build_parser() -> argparse.ArgumentParser:
    """The parser with every command group's verbs."""
    parser = ArgumentParser(prog="topoctl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMANDS:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the verb, return its exit code (errors mapped by `run_guarded`)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # only pass-through verbs (bench) take arguments they do not declare
        if not hasattr(args, "args"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.args = [*extra, *args.args]
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_ERROR
    return run_guarded("topoctl", lambda: args.func(args), json_out=getattr(args, "json", False))


if __name__ == "__main__":
    sys.exit(main())
