"""What both command lines share: the one mapping from errors to exit codes (protocol.py).

`run_guarded` is the only place either program turns an exception into an exit code:
a `TopoError` is expected (bad input, an unreachable host, a refused change): one line per
problem, `PROG: SOURCE: YAML.PATH: MESSAGE`, on stderr (or one JSON document on stdout with
--json) and EXIT_ERROR; anything else is a bug: its traceback, a line asking to report it, and
EXIT_BUG. `ArgumentParser` makes usage errors exit EXIT_ERROR too (argparse's own is 2, which
this convention keeps for "changes").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from collections.abc import Callable

from topoagent.protocol import EXIT_BUG, EXIT_ERROR, TopoError


class ArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors on EXIT_ERROR (bad input), not argparse's 2 (= changes)."""

    def error(self, message: str):
        """Print the usage and the error, exit EXIT_ERROR (1)."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


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


def run_guarded(prog: str, fn: Callable[[], int | None], json_out: bool = False) -> int:
    """Run `fn` (a verb), mapping its exceptions to the exit-code convention; returns the code."""
    try:
        return int(fn() or 0)
    except TopoError as e:
        if json_out:
            print(json.dumps(error_document(e)))
        else:
            for line in error_lines(prog, e):
                print(line, file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130  # the shell's 128 + SIGINT
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
