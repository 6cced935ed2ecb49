"""`topoctl bench NAME [ARGS...]`: run one of the source checkout's benchmark programs (`bench/`).

Benchmarks are programs, not library: they live in the package `bench/` at the root of the
checkout (the project is installed editable from it) and print their own tables. This verb only
finds the checkout, runs `python -m bench.NAME` there with this interpreter and passes the exit
code on (128 + N when signal N killed it); the programs follow the README's exit codes, usage
errors included (1, not argparse's 2): `bench` is a pass-through verb, its code is the
program's (no --json or --detailed-exitcode of its own)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import topoctl
from topoagent.protocol import TopoError

# verb name -> module in bench/'s subject packages (run as `python -m bench.MODULE`)
BENCHES = {
    "allreduce": ("trees.allreduce_lab",
                  "measured AllReduce on a lab: gloo vs ring vs packed trees"),
    "lab-check": ("planner.lab_check", "predicted vs measured iteration time in the lab"),
    "demo": ("demo", "the main job: every strategy planned, applied and trained in a lab"),
    "bandwidth": ("planner.bandwidth_sim", "simulated iteration time with and without +bandwidth, "
                  "every example cluster and strategy"),
    "heal": ("agent.heal", "a cable cut during `run --heal` in a lab: time until training "
             "runs again, predicted vs measured iteration time before and after"),
    "trees-own": ("trees.own_clusters", "the tree AllReduce on generated clusters unlike "
                  "the examples (plan, lab up, apply, run): iteration vs the optimum"),
}


class NoCheckoutError(TopoError):
    """topoctl is not installed from a source checkout: there is no `bench/` beside it."""


def source_checkout() -> Path:
    """The source checkout topoctl runs from: the directory holding the `bench` package
    (`bench/__init__.py`) beside `controller/topoctl/`. Raises `NoCheckoutError` when topoctl
    is installed some other way (a wheel in site-packages has no benchmarks)."""
    root = Path(topoctl.__file__).resolve().parents[2]
    if not (root / "bench" / "__init__.py").is_file():
        raise NoCheckoutError(f"no bench/ package in {root}: `topoctl bench` runs only from a "
                              "source checkout (pip install -e . in a clone of the project)")
    return root


def register(sub: argparse._SubParsersAction) -> None:
    """Add `topoctl bench NAME [ARGS...]`, one sub-verb per entry of `BENCHES`."""
    text = "run a benchmark program from bench/ (predicted vs measured)"
    p = sub.add_parser("bench", help=text, description=text,
                       epilog="example: topoctl bench lab-check --help")
    group = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (_, help_) in BENCHES.items():
        b = group.add_parser(name, help=help_, add_help=False,
                             epilog=f"example: topoctl bench {name} --help")
        b.add_argument("args", nargs=argparse.REMAINDER)
        b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run `python -m bench.MODULE ARGS...` in the checkout with this interpreter; returns its
    exit code (raises `NoCheckoutError`, exit 1, when there is no checkout or no such module
    in it)."""
    module = BENCHES[args.bench][0]
    root = source_checkout()
    path = root / "bench" / Path(*module.split("."))
    # a module file, or a package run through its __main__ (bench/demo/)
    if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
        raise NoCheckoutError(f"bench.{module} not found in the checkout ({path}.py)")
    rc = subprocess.call([sys.executable, "-m", f"bench.{module}", *args.args], cwd=root)
    return 128 - rc if rc < 0 else rc  # killed by signal N: the shell's 128 + N
