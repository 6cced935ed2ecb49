"""Benchmark: capture + cost model for a 12-layer BERT-style encoder (target <= 20 s).

BERT-base sizes (12 layers, hidden 768, 12 heads, seq 128, vocab 30522; 132 M parameters with
the untied output head). Times torch.fx capture with shape propagation on the meta device, the
roofline cost model (A100), and per-op measurement on this CPU as `topoctl plan` does it (timed
fx interpreter, 1 warm-up + median of 3 at the profile batch, scaled to the rank's batch, no
cache).

    python -m bench.planner.capture [BATCH [LAYERS]]
"""

from __future__ import annotations

import argparse
import time

import torch

from topoctl.catalog import build_model, example_inputs
from topoctl.graph.capture import capture_catalog
from topoctl.graph.cost import measure_costs, roofline_costs, scale_costs, totals
from topoctl.graph.devices import DEVICES
from topoctl.graph.profile import PROFILE_BATCH


def main(batch: int = 8, layers: int = 12) -> None:
    params = {"layers": layers, "hidden": 768, "heads": 12, "seq": 128}
    t0 = time.perf_counter()
    g = capture_catalog("bert", params, batch)
    t1 = time.perf_counter()
    roof = roofline_costs(g, DEVICES["A100"])
    t2 = time.perf_counter()
    torch.manual_seed(0)
    pb = min(batch, PROFILE_BATCH)
    model = build_model("bert", params)
    inputs = example_inputs("bert", params, pb)
    meas = scale_costs(measure_costs(model, inputs, capture_catalog("bert", params, pb)),
                       batch / pb)
    t3 = time.perf_counter()
    print(f"bert-{layers} batch={batch} (profiled at {pb}) ops={len(g.ops)} "
          f"params={g.param_bytes / 4e6:.0f}M fwd={g.flops / 1e9:.0f} GFLOP")
    print(f"capture={t1 - t0:.2f}s roofline={t2 - t1:.3f}s (A100 fwd+bwd "
          f"{sum(totals(roof)) * 1e3:.2f} ms) measured={t3 - t2:.2f}s (this CPU fwd "
          f"{totals(meas)[0] * 1e3:.0f} ms, torch threads {torch.get_num_threads()})")
    print(f"capture+roofline={t2 - t0:.2f}s capture+measured={t1 - t0 + t3 - t2:.2f}s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("batch", nargs="?", type=int, default=8, help="the rank's batch (8)")
    ap.add_argument("layers", nargs="?", type=int, default=12, help="encoder layers (12)")
    args = ap.parse_args()
    main(args.batch, args.layers)
