"""Plan some of the demo's strategies in a child process while the demo measures others.

`make demo` times the job's data-parallel step and the tree runtime's CPU costs first and plans
every data-parallel strategy with them; the pipeline strategies (:data:`AHEAD`) time pipeline
stages and the cores' crowding besides, seconds of CPU that the first rows, whose ring waits on
50 Mbit/s cables, leave idle. So `bench.demo.run` starts this program as a child at the
kernel's idle priority (``SCHED_IDLE``: it runs only on a core nothing else wants, and so do
the processes it starts, the co-running copies of the crowding's timing included), hands it
the timings it made (`topoctl.graph.profile.retimed`: the child reads them from the cache
instead of timing them again) and reads the plans it writes before measuring them. The plans
are the ones the demo made in its own process before: the same planner, the same timings.

    python -m bench.demo.ahead --retimed FILE --out DIR STRATEGY...

writes ``DIR/plan-STRATEGY.yaml`` for each strategy, in order.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from bench.common import ROOT
from bench.demo.planning import demo_cluster, job_document, plan_for

# the strategies whose planning times pipeline stages (and the crowding) on this CPU
AHEAD = ("pipeline", "placement", "tag")


def planned_ahead(strategy: str) -> bool:
    """Whether `strategy` (e.g. "placement", "pipeline+bandwidth") is planned in the child."""
    return strategy.split("+")[0] in AHEAD


def plan_path(out: Path, strategy: str) -> Path:
    """Where the child writes the plan of `strategy`."""
    return out / f"plan-{strategy}.yaml"


def idle_priority() -> None:
    """Run this process (and every process it starts) at the kernel's idle priority."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def normal_priority(pid: int) -> None:
    """Every thread of process `pid` and of its descendants back at the normal priority (the
    processes they start from now on too): the demo needs the plans now, and on a machine
    that other work keeps busy an idle-priority planner would not run at all."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.sched_setscheduler(int(task.name), os.SCHED_OTHER, os.sched_param(0))
            kids = (task / "children").read_text().split()
        except OSError:  # the thread or the process ended meanwhile
            continue
        for kid in kids:
            normal_priority(int(kid))


class Ahead:
    """The child process planning the strategies of `strategies` that `planned_ahead` picks,
    for a parent that measures the others meanwhile; `start` it once the parent's own timings
    are made, `plan` waits for one plan, `close` ends the child (also on failure)."""

    def __init__(self, strategies: list[str], out: Path, log: Callable[[str], None]) -> None:
        self.strategies = [s for s in strategies if planned_ahead(s)]
        self.out, self.log = out, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the child with what this process timed again (none: nothing to plan)."""
        if not self.strategies:
            return
        from topoctl.graph.profile import retimed  # the planner's modules: torch

        done = self.out / "retimed.json"
        done.write_text(json.dumps(retimed()))
        for s in self.strategies:
            plan_path(self.out, s).unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.demo.ahead", "--retimed",
                                      str(done), "--out", str(self.out), *self.strategies],
                                     cwd=ROOT)
        self.log(f"planning {', '.join(self.strategies)} ahead at idle priority")

    def plan(self, strategy: str) -> tuple[dict, float]:
        """The child's plan of `strategy` and the seconds spent waiting for it (the child at
        the normal priority from then on). SystemExit when the child failed."""
        path, t0 = plan_path(self.out, strategy), time.perf_counter()
        if self.proc is None or strategy not in self.strategies:
            raise ValueError(f"{strategy} is not planned ahead")
        if not path.exists() and self.proc.poll() is None:
            normal_priority(self.proc.pid)
        while not path.exists():
            if self.proc.poll() is not None and not path.exists():
                raise SystemExit(f"{strategy}: planning ahead failed (exit code "
                                 f"{self.proc.returncode})")
            time.sleep(0.1)
        return yaml.safe_load(path.read_text()), time.perf_counter() - t0

    def close(self) -> None:
        """End the child if it still runs (an interrupted or failed demo)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--retimed", type=Path, required=True,
                    help="JSON list: what the parent timed again (graph.profile.retimed)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("strategies", nargs="+")
    args = ap.parse_args(argv)
    idle_priority()
    from topoctl.graph.profile import adopt_retimed  # imports torch: at idle priority

    adopt_retimed(json.loads(args.retimed.read_text()))
    cluster, job_doc = demo_cluster()[0], job_document()
    for s in args.strategies:
        plan = plan_for(cluster, job_doc, s)
        tmp = plan_path(args.out, s).with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(plan, sort_keys=False))
        tmp.replace(plan_path(args.out, s))  # whole files only: the parent may be reading
    return 0


if __name__ == "__main__":
    sys.exit(main())
