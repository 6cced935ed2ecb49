"""Operator fusion's cost model (issue 35, item 3): regions of the catalog models measured on
this CPU eager and compiled by inductor, a small GNN against the simplest model that does as
well, errors on models held out of training, and the compile times.

    python -m bench.sync.fusion_costmodel --measure
        # compile (cold cache), time in a QUIET window, recompile in a new process (warm
        # cache); writes controller/topoctl/disco/fusion/data/regions.json, then as below
    python -m bench.sync.fusion_costmodel
        # fit and evaluate from the stored dataset; writes controller/topoctl/disco/fusion/fitted.py
        # and prints the Markdown of docs/results.md's section

Held-out error: leave one model out (train on the regions of the five other catalog models,
predict the sixth's), |predicted - measured| / measured fused seconds."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT

DATA = ROOT / "controller/topoctl/disco/fusion/data/regions.json"
FITTED = ROOT / "controller/topoctl/disco/fusion/fitted.py"
QUIET = Path("/work/shared/helpers/QUIET")


def _quiet_window(name: str = "dfuse") -> bool:
    """Wait (up to 20 min) until no QUIET file exists, then create ours; False: gave up
    (the timings are then under load)."""
    for _ in range(40):
        if not QUIET.exists():
            QUIET.write_text(name + "\n")
            return True
        time.sleep(30)
    return False


def _compile_all(models: list[str]) -> dict[str, list]:
    from topoctl.disco.fusion.measure import compile_regions

    return {m: compile_regions(m) for m in models}


def compile_only() -> None:
    """Print {model: {region: compile seconds}} of a compile in this process (warm-cache run)."""
    from topoctl.disco.fusion.measure import CONFIGS

    regions = _compile_all(list(CONFIGS))
    print(json.dumps({m: {r.region: [round(r.compile_s, 3), round(r.compile_cpu_s, 3)]
                          for r in rs} for m, rs in regions.items()}))


def measure() -> None:
    """The dataset: cold compile, quiet timing, warm recompile (see the module doc)."""
    cache = tempfile.mkdtemp(prefix="topoctl-fusion-bench-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    from topoctl.disco.fusion.measure import CONFIGS, time_regions

    t0 = time.perf_counter()
    regions = _compile_all(list(CONFIGS))
    print(f"compiled {sum(map(len, regions.values()))} regions in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    quiet = _quiet_window()
    try:
        load0 = os.getloadavg()[0]
        samples = [s for rs in regions.values() for s in time_regions(rs)]
        load1 = os.getloadavg()[0]
    finally:
        if quiet:
            QUIET.unlink(missing_ok=True)
    warm = json.loads(subprocess.run([sys.executable, "-m", "bench.sync.fusion_costmodel",
                                      "--compile-only"], capture_output=True, text=True,
                                     env=os.environ | {"TORCHINDUCTOR_CACHE_DIR": cache},
                                     check=True, cwd=ROOT).stdout.splitlines()[-1])
    for s in samples:
        s["compile_warm_s"], s["compile_warm_cpu_s"] = warm[s["model"]][s["region"]]
        s["eager_s"], s["fused_s"] = round(s["eager_s"], 7), round(s["fused_s"], 7)
    import torch

    doc = {"machine": platform.processor() or platform.machine(), "cpu": _cpu_name(),
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d", time.gmtime()),
           "quiet": quiet, "load_avg": [round(load0, 2), round(load1, 2)],
           "threads": 1, "configs": {m: {"params": p, "batch": b}
                                     for m, (p, b) in CONFIGS.items()},
           "samples": samples}
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_text(json.dumps(doc, indent=None, sort_keys=True) + "\n")
    print(f"wrote {DATA} ({len(samples)} regions, quiet={quiet})", file=sys.stderr)


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def evaluate(samples: list[dict]) -> dict:
    """Leave-one-model-out errors of the constant, launch and GNN models, and their fit on
    all samples."""
    from topoctl.disco.fusion.gnn import GnnModel
    from topoctl.disco.fusion.model import ConstantModel, LaunchModel, relative_errors, summary

    kinds = {"constant": ConstantModel, "launch": LaunchModel, "gnn": GnnModel}
    models = sorted({s["model"] for s in samples})
    held: dict[str, dict[str, dict]] = {k: {} for k in kinds}
    pooled: dict[str, list[float]] = {k: [] for k in kinds}
    for m in models:
        train = [s for s in samples if s["model"] != m]
        test = [s for s in samples if s["model"] == m]
        for k, cls in kinds.items():
            errs = relative_errors(cls.fit(train).predict, test)
            held[k][m] = summary(errs)
            pooled[k] += errs
    fit = {k: summary(relative_errors(cls.fit(samples).predict, samples))
           for k, cls in kinds.items()}
    return {"held_out": held, "pooled": {k: summary(v) for k, v in pooled.items()},
            "fit": fit, "models": models}


def write_fitted(samples: list[dict]) -> str:
    """controller/topoctl/disco/fusion/fitted.py with the launch model fitted on every sample."""
    from topoctl.disco.fusion.model import LaunchModel

    m = LaunchModel.fit(samples)
    FITTED.write_text(
        '"""The fused-region cost model fitted by `bench/sync/fusion_costmodel.py` on all the '
        "catalog's\nmeasured regions (`data/regions.json`); written by that program, do not "
        'edit."""\n\nfrom topoctl.disco.fusion.model import LaunchModel\n\n'
        f"MODEL = LaunchModel(r={m.r:.6g}, a={m.a:.6g}, b={m.b:.6g})\n")
    return f"r = {m.r:.4g}, a = {m.a * 1e6:.3g} us per op, b = {m.b * 1e12:.3g} ps per byte"


def markdown(doc: dict, ev: dict, coef: str) -> str:
    """The Markdown of the results section's tables."""
    s = doc["samples"]
    lines = [f"- Machine and date: {doc['cpu']}, torch {doc['torch']}, one torch thread, "
             f"{'quiet' if doc['quiet'] else 'under load'} (load average "
             f"{doc['load_avg'][0]}-{doc['load_avg'][1]}), {doc['date']}.",
             f"- Dataset: {len(s)} regions of {len(ev['models'])} catalog models; fused / eager "
             f"median {statistics.median(x['fused_s'] / x['eager_s'] for x in s):.2f} "
             f"(range {min(x['fused_s'] / x['eager_s'] for x in s):.2f}-"
             f"{max(x['fused_s'] / x['eager_s'] for x in s):.2f}).",
             f"- Fitted launch model (all regions): {coef}.", "",
             "| held-out model | regions | constant ratio: mean / median / max % | "
             "launch model | GNN |", "|---|---|---|---|---|"]
    for m in ev["models"]:
        n = sum(x["model"] == m for x in s)
        cells = [" / ".join(str(v) for v in ev["held_out"][k][m].values())
                 for k in ("constant", "launch", "gnn")]
        lines.append(f"| {m} | {n} | " + " | ".join(cells) + " |")
    cells = [" / ".join(str(v) for v in ev["pooled"][k].values())
             for k in ("constant", "launch", "gnn")]
    lines.append("| all held-out regions | " + str(len(s)) + " | " + " | ".join(cells) + " |")
    cells = [" / ".join(str(v) for v in ev["fit"][k].values())
             for k in ("constant", "launch", "gnn")]
    lines.append("| (fit on all, no hold-out) | " + str(len(s)) + " | " + " | ".join(cells)
                 + " |")
    lines += ["", "| model | regions | whole model: eager ms / fused ms (fwd+bwd) | "
              "compile, whole model, cold cache: CPU s (wall s) | warm cache: CPU s (wall s) | "
              "compile, all regions, cold: CPU s |", "|---|---|---|---|---|---|"]
    for m in ev["models"]:
        rs = [x for x in s if x["model"] == m]
        w = next((x for x in rs if x["region"] == ""), None)
        whole = ("not measured (over the op cap) | - | - | " if w is None else
                 f"{1e3 * w['eager_s']:.2f} / {1e3 * w['fused_s']:.2f} | "
                 f"{w['compile_cpu_s']:.1f} ({w['compile_s']:.1f}) | "
                 f"{w['compile_warm_cpu_s']:.1f} ({w['compile_warm_s']:.1f}) | ")
        lines.append(f"| {m} | {len(rs)} | {whole}{sum(x['compile_cpu_s'] for x in rs):.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="measure the dataset first")
    ap.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.compile_only:
        compile_only()
        return 0
    if a.measure:
        measure()
    import torch

    torch.set_num_threads(1)
    doc = json.loads(DATA.read_text())
    # samples marked invalid (a region that did not really compile) are kept, not used
    doc["samples"] = [s for s in doc["samples"] if not s.get("invalid")]
    ev = evaluate(doc["samples"])
    print(markdown(doc, ev, write_fitted(doc["samples"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
