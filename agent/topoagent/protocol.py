"""The controller-agent contract: API version, exit codes and the one error type.

Both programs (`topoctl`, `topo-agent`) and every verb use these; the agent never imports the
controller, the controller imports this module.

Exit codes (README, "Exit codes"):
  0 EXIT_OK       success, nothing to do / nothing changed
  1 EXIT_ERROR    error: bad input (file and YAML path named), a failed host, a refused request
  2 EXIT_CHANGES  changes made (apply, rollback) or pending (diff, dry-run, status: drift)
  3 EXIT_PARTIAL  some hosts failed and were rolled back while others were fine
"""

from __future__ import annotations

API_VERSION = "topoctl/v1"

EXIT_OK, EXIT_ERROR, EXIT_CHANGES, EXIT_PARTIAL = 0, 1, 2, 3


class TopoError(Exception):
    """Base of every expected error of both programs: bad input, an unreachable host, a refused
    change. `problems` is a list of (yaml_path, message); `path` the first one's path. The CLIs
    print it and exit with EXIT_ERROR; any other exception is a bug (traceback + report line)."""

    def __init__(self, problems: str | list[tuple[str, str]], path: str = ""):
        if isinstance(problems, str):
            problems = [(path, problems)]
        self.problems = list(problems)
        super().__init__("\n".join(f"{p}: {m}" if p else m for p, m in self.problems))

    @property
    def path(self) -> str:
        return self.problems[0][0] if self.problems else ""
