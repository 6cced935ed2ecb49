"""What both command lines share: the one mapping from errors to exit codes (protocol.py).

`run_guarded` is the only place either program turns an exception into an exit code:
a `TopoError` is expected (bad input, an unreachable host, a refused change): one line per
problem, `PROG: SOURCE: YAML.PATH: MESSAGE`, on stderr (or one JSON document on stdout with
--json) and EXIT_ERROR; anything else is a bug: its traceback, a line asking to report it, and
EXIT_BUG. `ArgumentParser` makes usage errors exit EXIT_ERROR too (argparse's own is 2, which
this convention keeps for "changes", with --detailed-exitcode only).

The options both programs share, added the same way: `add_global_options` (--version, and
--json and --detailed-exitcode before the verb), `add_json` and `add_detailed_exitcode` (the
same options after the verb), `run_verb` (what `main` of both programs calls).
"""

from __future__ import annotations

import argparse
import contextvars
import json
import math
import sys
import traceback
from collections.abc import Callable, Sequence

from topoagent.protocol import (
    EXIT_BUG,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    TopoError,
    exit_status,
)

DETAILED_HELP = ("exit 2 when changes were made or are pending (drift), 0 when there was "
                 "nothing to do (in sync), 1 on error (terraform's --detailed-exitcode)")


# set by `parse_command_line` while it parses a command line that asks for --json: a usage
# error then also answers with the JSON error document on stdout (the verbs' sub-parsers are
# instances of `ArgumentParser` made by argparse itself, so the flag cannot be an attribute)
_JSON_USAGE = contextvars.ContextVar("topo_json_usage", default=False)


class UsageError(TopoError):
    """A command line argparse refused (the error document's form of a usage error)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors on EXIT_ERROR (bad input), not argparse's 2 (= changes),
    and, when the command line asks for --json, the error as one JSON document on stdout."""

    def error(self, message: str):
        """Print the usage and the error (and with --json the error document), exit
        EXIT_ERROR (1)."""
        self.print_usage(sys.stderr)
        if _JSON_USAGE.get():
            print(json.dumps(error_document(UsageError(message, source=self.prog))),
                  flush=True)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def wants_json(argv: Sequence[str]) -> bool:
    """Whether a command line asks for --json (before a `--`: after it, words are the
    arguments of a program run through a pass-through verb)."""
    words = list(argv)
    if "--" in words:
        words = words[:words.index("--")]
    return "--json" in words


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str],
                       known: bool = False):
    """`parser.parse_args(argv)` (`parse_known_args` when `known`), with usage errors also as
    the JSON error document on stdout when `argv` asks for --json (`wants_json`)."""
    token = _JSON_USAGE.set(wants_json(argv))
    try:
        return parser.parse_known_args(argv) if known else parser.parse_args(argv)
    finally:
        _JSON_USAGE.reset(token)


def printable(text: object) -> str:
    """`text` with control characters escaped (`\\n`, `\\x1e`): a YAML key or value from the
    input must not break the one-line-per-problem output or drive the terminal."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def error_lines(prog: str, err: TopoError) -> list[str]:
    """`PROG: SOURCE: PATH: MESSAGE` per problem, empty parts left out, one line each."""
    return [": ".join(printable(x) for x in filter(None, [prog, err.source, p, m]))
            for p, m in err.problems] or [f"{prog}: {type(err).__name__}"]


def error_document(err: TopoError) -> dict:
    """The --json form of an error: what the controller's transports parse from the agent."""
    return {"ok": False, "exit_code": EXIT_ERROR, "error": str(err), "source": err.source,
            "reverted": getattr(err, "reverted", None),
            "problems": [{"path": p, "message": m} for p, m in err.problems]}


def add_global_options(parser: argparse.ArgumentParser, version: str) -> None:
    """--version (`PROG VERSION`, exit 0), and --json and --detailed-exitcode given before the
    verb (the verbs take them after their name too: `add_json`, `add_detailed_exitcode`)."""
    parser.add_argument("--version", action="version", version=f"{parser.prog} {version}")
    parser.add_argument("--json", action="store_true", default=False,
                        help="machine-readable output: one JSON document on stdout, errors "
                             "included (also accepted after the verb)")
    parser.add_argument("--detailed-exitcode", action="store_true", default=False,
                        help=f"on verbs that change or compare state: {DETAILED_HELP}")


def add_json(p: argparse.ArgumentParser, help: str = "one JSON document on stdout") -> None:
    """--json after a verb's name; given before the verb it counts as well (the default is
    SUPPRESS so the verb's parser does not overwrite the global option's value)."""
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=help)


def add_detailed_exitcode(p: argparse.ArgumentParser) -> None:
    """--detailed-exitcode for a verb that changes or compares state: the verb reports
    EXIT_CHANGES for changes and `run_verb` passes it on only when asked (else EXIT_OK)."""
    p.add_argument("--detailed-exitcode", action="store_true", default=argparse.SUPPRESS,
                   help=DETAILED_HELP)
    p.set_defaults(compares_state=True)


def run_verb(prog: str, args: argparse.Namespace, fn: Callable[[], int | None]) -> int:
    """Run a parsed verb through `run_guarded` with its --json and, where the verb compares
    state, --detailed-exitcode; other verbs' codes pass unchanged (a pass-through verb such
    as `topoctl bench` or `lab exec` returns its program's own code)."""
    detailed = (bool(getattr(args, "detailed_exitcode", False))
                if getattr(args, "compares_state", False) else None)
    return run_guarded(prog, fn, json_out=bool(getattr(args, "json", False)), detailed=detailed)


def run_guarded(prog: str, fn: Callable[[], int | None], json_out: bool = False,
                detailed: bool | None = None) -> int:
    """Run `fn` (a verb), mapping its exceptions to the exit-code convention; returns the code.
    `detailed` False turns the verb's EXIT_CHANGES into EXIT_OK (no --detailed-exitcode), True
    keeps it, None (a verb that does not compare state) passes every code on as it is."""
    try:
        code = int(fn() or 0)
        return code if detailed is None else exit_status(code, detailed)
    except TopoError as e:
        if json_out:
            print(json.dumps(error_document(e)))
        else:
            for line in error_lines(prog, e):
                print(line, file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `topoctl plan ... | head`: the reader left, nothing to report
        return EXIT_ERROR
    except Exception:
        traceback.print_exc()
        print(f"{prog}: this is a bug in {prog}, please report it with the command line and "
              "the traceback above", file=sys.stderr)
        return EXIT_BUG


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (anything else is a usage error, exit 1)."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return v


def positive_seconds(text: str) -> float:
    """argparse type: finite seconds > 0 (nan, inf and negatives are usage errors)."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return v
