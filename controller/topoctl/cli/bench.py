"""`topoctl bench NAME [ARGS...]`: run one of the source checkout's benchmark programs (`bench/`).

Benchmarks are programs, not library: they live in `bench/` beside the package (the project is
installed editable from its checkout) and print their own tables. This verb only finds the
program, runs it with this interpreter and passes its exit code on (128 + N when signal N killed
it); the programs follow the README's exit codes, usage errors included (1, not argparse's 2)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import topoctl

# verb name -> program in bench/
BENCHES = {
    "allreduce": ("allreduce_lab.py", "measured AllReduce on a lab: gloo vs ring vs packed trees"),
    "lab-check": ("planner_lab_check.py", "predicted vs measured iteration time in the lab"),
    "demo": ("demo.py", "the main job: every strategy planned, applied and trained in a lab"),
    "bandwidth": ("bandwidth_sim.py", "simulated iteration time with and without +bandwidth, "
                  "every example cluster and strategy"),
    "heal": ("heal_lab.py", "a cable cut during `run --heal` in a lab: time until training "
             "runs again, predicted vs measured iteration time before and after"),
    "trees-own": ("trees_own_clusters.py", "the tree AllReduce on generated clusters unlike "
                  "the examples (plan, lab up, apply, run): iteration vs the optimum"),
}


def bench_dir() -> Path:
    """The checkout's `bench/` directory (the package is installed editable from it)."""
    return Path(topoctl.__file__).resolve().parents[2] / "bench"


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl bench NAME [ARGS...]`, one sub-verb per entry of `BENCHES`."""
    p = sub.add_parser("bench", help="run a benchmark program from bench/ (predicted vs measured)")
    group = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (_, help_) in BENCHES.items():
        b = group.add_parser(name, help=help_, add_help=False)
        b.add_argument("args", nargs=argparse.REMAINDER)
        b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark program with this interpreter; returns its exit code (1 when not found)."""
    program = bench_dir() / BENCHES[args.bench][0]
    if not program.is_file():
        print(f"topoctl bench: {program} not found: benchmarks run from a source checkout",
              file=sys.stderr)
        return 1
    rc = subprocess.call([sys.executable, str(program), *args.args])
    return 128 - rc if rc < 0 else rc  # killed by signal N: the shell's 128 + N
