"""`topoctl bench ...`: measurements on a lab, side by side in one run.

Each benchmark module has `register(bench_subparsers)`; add it to BENCHES."""

from __future__ import annotations

import argparse
import importlib

BENCHES = ["topoctl.bench_allreduce"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure on a lab: predicted vs measured, baselines")
    group = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for mod in BENCHES:
        importlib.import_module(mod).register(group)
