"""`topoctl` command line. Each command group lives in its own module and registers itself
here through `COMMANDS`: a module with `register(subparsers)` that sets `func` on its parsers.

Errors: a verb raises a `TopoError` (topoagent.protocol) for anything expected (bad input, an
unreachable host); `main` is the one place that maps it to `topoctl: FILE: yaml.path: message`
and exit 1 (`topoagent.cliutil.run_verb`); any other exception is a bug (traceback, a line
asking to report it, exit 70). Exit codes are the protocol's for every verb (README "Exit
codes"): a verb returns its detailed outcome (EXIT_CHANGES for changes made or pending, drift)
and `run_verb` exits 2 for it only with --detailed-exitcode, else 0. Every verb's parser has
one example as its epilog; --json and --detailed-exitcode work before the verb or after it.
Helpers the verb modules share live in `topoctl.cli.output`: verb modules never import this
package's `__init__`."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import topoctl
from topoagent.cliutil import (
    ArgumentParser,
    UsageError,
    add_global_options,
    error_document,
    parse_command_line,
    run_verb,
    wants_json,
)
from topoagent.protocol import EXIT_ERROR

DESCRIPTION = ("plan the network of a distributed DNN training job (cabling, routes, QoS,\n"
               "AllReduce trees) and roll it out to every host's topo-agent")
EPILOG = """\
example:
  topoctl plan cluster.yaml job.yaml -o plan.yaml &&
    topoctl apply plan.yaml && topoctl run plan.yaml

exit codes:
  0    success (changes made or not)
  1    error: bad input (file and YAML path named) or usage
  3    partial: some hosts failed, the others were rolled back
  70   a bug (traceback)
  130  interrupted (run: also stopped by `topoctl stop`)
  with --detailed-exitcode (apply, diff, status, rollback, stop, lab status, lab rewire):
  0 nothing to do / in sync, 2 changes made or pending / drift"""

# module paths, each with register(subparsers); add a line per command group
# verb -> the module that registers it; a call imports only its verb's module (the others
# pull in scipy, paramiko or ansible: a second of CPU before any work), help imports them all
VERBS: dict[str, str] = {
    "apply": "topoctl.cli.apply", "diff": "topoctl.cli.apply", "status": "topoctl.cli.apply",
    "rollback": "topoctl.cli.apply", "bench": "topoctl.cli.bench",
    "inventory": "topoctl.cli.inventory", "lab": "topoctl.cli.lab", "plan": "topoctl.cli.plan",
    "explain": "topoctl.cli.plan", "run": "topoctl.cli.run", "stop": "topoctl.cli.run",
    "topology": "topoctl.cli.topology", "trees": "topoctl.cli.trees", "sync": "topoctl.cli.trees",
    "vagrant": "topoctl.cli.vagrant", "tag": "topoctl.cli.tag", "export": "topoctl.cli.export",
}
COMMANDS: list[str] = sorted(set(VERBS.values()))


def modules_for(argv: list[str]) -> list[str]:
    """The verb modules a call needs: its verb's (the first word that is not an option: the
    global options take no value), none for a bare ``--version``, else all (help, a typo)."""
    words = [a for a in argv if not a.startswith("-")]
    if words:
        return [VERBS[words[0]]] if words[0] in VERBS else COMMANDS
    return [] if "--version" in argv else COMMANDS


def build_parser(modules: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser with the verbs of `modules` (default: every command group's)."""
    parser = ArgumentParser(prog="topoctl", description=DESCRIPTION, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_global_options(parser, topoctl.__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in COMMANDS if modules is None else modules:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, run the verb, return its exit code (errors mapped by `run_guarded`)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(modules_for(argv))
    args, extra = parse_command_line(parser, argv, known=True)
    if extra:  # only pass-through verbs (bench) take arguments they do not declare
        if not hasattr(args, "args"):
            parse_command_line(parser, argv)  # the usage error argparse gives for them
        args.args = [*extra, *args.args]
    if not getattr(args, "func", None):  # no verb: a usage error (JSON too when asked)
        if wants_json(argv):
            print(json.dumps(error_document(UsageError("a command is required",
                                                       source="topoctl"))))
        parser.print_help(sys.stderr if wants_json(argv) else sys.stdout)
        return EXIT_ERROR
    return run_verb("topoctl", args, lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
