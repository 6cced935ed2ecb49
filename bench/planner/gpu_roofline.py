"""Each catalog model's ops timed on an accelerator against the planner's roofline, with the
error per op kind: what tells whether plans for GPU clusters can trust the roofline costs.

    python -m bench.planner.gpu_roofline --gpu-type A100 [--dtype float16] [--batch 32]
    python -m bench.planner.gpu_roofline --device cpu --gpu-type CPU   # the same code on a CPU

On a machine without CUDA it says so in one line and exits 0 (nothing to time). Per model:
forward times of every op (fx nodes run one by one, the device synchronised around each, the
median of `--repeats`), the roofline's forward time of the same op on `--gpu-type` (the
cluster file's table: `topoctl.graph.devices`), and per op kind the summed measured and
predicted milliseconds and their error. Backward passes are not timed (the roofline derives
them from the forward's FLOPs and bytes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

MODELS = {  # catalog models at sizes one GPU runs in seconds
    "mlp": {}, "resnet": {"depth": 50}, "vgg": {"depth": 16}, "bert": {"layers": 4},
    "lm": {"layers": 4, "hidden": 1024, "heads": 16, "seq": 256, "vocab": 32000},
    "dlrm": {}, "candle_uno": {},
}


def op_times(model, inputs, device: str, repeats: int) -> dict[str, float]:
    """Median forward seconds of every fx node of `model` on `device`."""
    import torch
    from torch import fx

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times: dict[str, list[float]] = {}

    class Timed(fx.Interpreter):
        def run_node(self, n):
            sync()
            t0 = time.perf_counter()
            out = super().run_node(n)
            sync()
            times.setdefault(n.name, []).append(time.perf_counter() - t0)
            return out

    interp = Timed(fx.symbolic_trace(model))
    with torch.no_grad():
        interp.run(*inputs)  # warm-up: kernels chosen, caches filled
        times.clear()
        for _ in range(repeats):
            interp.run(*inputs)
    return {k: statistics.median(v) for k, v in times.items()}


def kind_errors(name: str, params: dict, batch: int, device: str, gpu_type: str, dtype: str,
                repeats: int) -> list[tuple[str, int, float, float]]:
    """(op kind, ops, measured ms, roofline ms) per kind of model `name`'s forward."""
    import torch

    from topoctl.catalog.build import build_model, example_inputs
    from topoctl.graph.capture import capture_catalog
    from topoctl.graph.cost import roofline_costs
    from topoctl.graph.devices import DEVICES

    torch.manual_seed(0)
    model = build_model(name, params, device).to(getattr(torch, dtype))
    inputs = tuple(x.to(getattr(torch, dtype)) if x.is_floating_point() else x
                   for x in example_inputs(name, params, batch, device))
    measured = op_times(model, inputs, device, repeats)
    graph = capture_catalog(name, params, batch, dtype)
    roof = roofline_costs(graph, DEVICES[gpu_type], dtype)
    rows: dict[str, list[float]] = {}
    for op in graph.ops:
        if op.is_view or op.name not in measured:
            continue
        r = rows.setdefault(op.kind, [0, 0.0, 0.0])
        r[0] += 1
        r[1] += measured[op.name] * 1e3
        r[2] += roof[op.name].fwd * 1e3
    return [(k, int(n), m, p) for k, (n, m, p) in sorted(rows.items())]


def report(rows: list[tuple[str, int, float, float]]) -> list[str]:
    """Table lines: kind, ops, measured ms, roofline ms, error of the roofline."""
    out = [f"  {'kind':<22} {'ops':>4} {'measured ms':>12} {'roofline ms':>12} {'error':>8}"]
    for kind, n, m, p in rows:
        err = f"{(p - m) / m:+.0%}" if m > 0 else "-"
        out.append(f"  {kind:<22} {n:>4} {m:>12.3f} {p:>12.3f} {err:>8}")
    m, p = sum(r[2] for r in rows), sum(r[3] for r in rows)
    out.append(f"  {'all':<22} {sum(r[1] for r in rows):>4} {m:>12.3f} {p:>12.3f} "
               f"{(p - m) / m if m else 0:>+8.0%}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--gpu-type", default="A100", help="the roofline's device type")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device on this machine: nothing timed (this check needs a GPU)")
        return 0
    for name in args.models:
        rows = kind_errors(name, MODELS[name], args.batch, args.device, args.gpu_type,
                           args.dtype, args.repeats)
        print(f"{name} {MODELS[name] or ''} batch {args.batch} {args.dtype} on {args.device} "
              f"against the {args.gpu_type} roofline:")
        print("\n".join(report(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
