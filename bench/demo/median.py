#!/usr/bin/env python3
"""Median of several demo runs, as the README's demo table.

Each run of ``python -m bench.demo --out DIR`` writes ``DIR/results.json``; run it three times on a
quiet machine and pass the three files here::

    python -m bench.demo.median /tmp/r1/results.json /tmp/r2/results.json /tmp/r3/results.json

``python -m bench.demo --careful`` does the three runs and prints this table itself. The table
shows, per strategy, what its plan is (hosts used, ring, trees, stages, bandwidth classes; each
plan once when runs planned differently), the median prediction (lab ranks' ops are timed again
at each run's start), the median measured iteration with the range over the runs, the median of
the runs' own prediction errors, the speedup of the median against the baseline's median, and
the median against the packed-tree AllReduce optimum.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _load(paths: list[Path]) -> tuple[dict[str, list[dict]], float | None]:
    runs: dict[str, list[dict]] = {}
    optimum = None
    for path in paths:
        doc = json.loads(path.read_text())
        optimum = doc["allreduce_optimum"] or optimum
        for row in doc["rows"]:
            runs.setdefault(row["strategy"], []).append(row)
    return runs, optimum


def _plan(rows: list[dict]) -> str:
    """The runs' plan summaries (bench/demo/run.py's `plan_summary`), each once: runs re-timed
    apart may plan differently, and the row then says so."""
    return " / ".join(dict.fromkeys(r["plan"] for r in rows if r.get("plan"))) or "-"


def median_rows(paths: list[Path]) -> tuple[list[dict], float | None]:
    """Per strategy (first-run order) a row of medians as bench/demo/run.py's table and plot take
    them: strategy, plan, predicted, measured, runs; and the AllReduce optimum."""
    runs, optimum = _load(paths)
    return [{"strategy": name, "plan": _plan(rows),
             "predicted": statistics.median(r["predicted"] for r in rows),
             "measured": statistics.median(r["measured"] for r in rows), "runs": len(rows)}
            for name, rows in runs.items()], optimum


def median_table(paths: list[Path]) -> str:
    """The markdown table of the runs' medians (strategies in first-run order)."""
    runs, optimum = _load(paths)
    base = statistics.median(r["measured"] for r in runs.get("baseline", []) or [{"measured": 0}])
    lines = [
        "strategy | plan | predicted s/it | measured s/it, median (range) | prediction error"
        " | speedup vs baseline | measured/optimal AllReduce",
        "--- | --- | --- | --- | --- | --- | ---",
    ]
    for name, rows in runs.items():
        measured = [r["measured"] for r in rows]
        med = statistics.median(measured)
        # each run plans with the ops timed at its start (`--retime`): the median prediction,
        # and the median of the runs' own errors (prediction and measurement of one run)
        predicted = statistics.median(r["predicted"] for r in rows)
        error = statistics.median((r["predicted"] - r["measured"]) / r["measured"] * 100
                                  for r in rows)
        speedup = f"{base / med:.2f}x" if base else "-"
        # a row some runs lack (e.g. the OVS row, skipped with --no-ovs): say how many had it
        few = f"; {len(rows)} of {len(paths)} runs" if len(rows) < len(paths) else ""
        lines.append(
            f"{name} | {_plan(rows)} | {predicted:.3f} | {med:.3f} ({min(measured):.3f}-"
            f"{max(measured):.3f}{few}) | {error:+.1f}% | {speedup} | "
            f"{f'{med / optimum:.2f}' if optimum else '-'}"
        )
    lines.append("")
    # no optimum when no run planned packed trees (e.g. --strategies without trees)
    lines.append(f"{len(paths)} runs; " + (f"AllReduce optimum {optimum:.3f} s (packed-tree LP)."
                                          if optimum else "no AllReduce optimum (no trees)."))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="results.json of each demo run")
    args = ap.parse_args()
    missing = [str(p) for p in args.results if not p.is_file()]
    if missing:
        print(f"demo_median: no such file: {', '.join(missing)}", file=sys.stderr)
        return 1
    print(median_table(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
