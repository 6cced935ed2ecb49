"""The controller-agent contract: API version, exit codes and the one error type.

Both programs (`topoctl`, `topo-agent`) and every verb use these; the agent never imports the
controller, the controller imports this module. The typed documents that cross the wire (the
job launch spec, a plan's per-host part) are in `topoagent.state.wire`.

Exit codes (README, "Exit codes"), one meaning each, every verb of both programs:
  0   EXIT_OK           success, whether or not anything changed (or drifted)
  1   EXIT_ERROR        error: bad input (file and YAML path named), usage errors included, a
                        failed host, a refused request
  3   EXIT_PARTIAL      some hosts failed and the hosts that had changed were rolled back
  70  EXIT_BUG          an unexpected exception: a bug, reported with its traceback (EX_SOFTWARE)
  130 EXIT_INTERRUPTED  interrupted (Ctrl-C: the shell's 128 + SIGINT)
With `--detailed-exitcode` (terraform's), on the verbs that change or compare state (apply,
diff, rollback, stop, status, watch, recover; topoctl lab status and rewire), success splits:
  0   EXIT_OK           nothing to do / in sync
  2   EXIT_CHANGES      changes made (apply, rollback, stop, recover) or pending (diff,
                        --dry-run, status: drift)
so 2 only ever means "changes", and only when asked. Inside the programs the verbs and the
rollout library report the detailed outcome (EXIT_CHANGES for changes); `exit_status` (applied
once, by `topoagent.cliutil.run_guarded`) turns it into the process's exit code.
"""

from __future__ import annotations

API_VERSION = "topoctl/v1"

EXIT_OK, EXIT_ERROR, EXIT_CHANGES, EXIT_PARTIAL = 0, 1, 2, 3
EXIT_BUG = 70  # sysexits.h EX_SOFTWARE: never the answer to bad input
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT
# `topo-agent stop --reason`: the default, an operator's stop (`topoctl stop`); a launch stopped
# so reports a `stopped` event with it and `topoctl run` reports the job stopped (exit 130)
STOP_BY_OPERATOR = "operator"
# the reason `topoctl run` gives when it stops the other hosts after one failed
STOP_AFTER_FAILURE = "another host's ranks ended"


def exit_status(code: int, detailed: bool) -> int:
    """The exit code of a verb whose outcome is `code` (EXIT_CHANGES when it changed something
    or found drift): EXIT_CHANGES only with `detailed` (--detailed-exitcode), else EXIT_OK;
    every other code as it is."""
    return EXIT_OK if code == EXIT_CHANGES and not detailed else code


class TopoError(Exception):
    """Base of every expected error of both programs: bad input, an unreachable host, a refused
    change. `problems` is a list of (yaml_path, message); `path` the first one's path; `source`
    the file (or `<stdin>`, `--flag`) the paths are in, empty when unknown. The CLIs print one
    line per problem, `PROG: SOURCE: PATH: MESSAGE`, and exit with EXIT_ERROR; any other
    exception is a bug (traceback + report line, EXIT_BUG)."""

    def __init__(self, problems: str | list[tuple[str, str]], path: str = "",
                 source: str = ""):
        if isinstance(problems, str):
            problems = [(path, problems)]
        self.problems = list(problems)
        self.source = source
        super().__init__(self._text())

    def _text(self) -> str:
        return "\n".join(": ".join(filter(None, [self.source, p, m])) for p, m in self.problems)

    def __str__(self) -> str:
        return self._text()

    @property
    def path(self) -> str:
        """The YAML path of the first problem ('' when none)."""
        return self.problems[0][0] if self.problems else ""

    def at(self, source: str) -> TopoError:
        """Name the file the problems are in (unless already named); returns self, so
        `raise e.at(args.job)` re-raises it."""
        if not self.source:
            self.source = str(source)
        return self
