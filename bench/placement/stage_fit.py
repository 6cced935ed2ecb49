"""How well the per-op training costs charge a pipeline stage (no lab; time under the quiet lock).

For every two-stage split of a catalog model (the split after each fx node but the first and
the last two), each stage is run alone as the pipeline runtime runs it
(`topotrain.pipeline.gpipe_passes` with fake neighbours: a send returns at once, a receive
copies a fixed tensor) and its CPU time (one torch thread, `time.thread_time`) is set against
what the model charges the stage (`placement.runtime.stage_costs`) from the per-op times timed
alone, fitted to the whole model run as one stage (`graph.steptime.stage_step_times`) by each
rule:

- `factor`: one factor per phase (forward, backward), the same for every op (the old rule);
- `per-node`: the forward's excess over its ops' sum shared equally per interpreted node
  (`graph.cost.fit_to_whole_step` now; backward by one factor);
- `least squares`: per phase, ``a x ops + b x nodes`` fitted over every stage of the round
  (what the best two-term rule could do with every split timed).

    python -m bench.placement.stage_fit [--rounds 3] [--batch 64]
        [--job bench/hybrid/mlp-hybrid-job.yaml]

Prints each stage (per iteration of `--micro` micro-batches, ms) and each rule's error: rms
over every stage, and the stages of the split after `--split` nodes (stars6's plan: 4)."""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch
from torch import fx

from topoagent.cliutil import ArgumentParser
from topoctl.catalog.build import build_model, example_inputs
from topoctl.graph.cost import TrainCost, fit_to_whole_step, op_train_costs
from topoctl.graph.profile import job_graph
from topoctl.placement.runtime import stage_costs
from topoctl.spec.job import load_job
from topotrain.timing import Stage, gpipe_passes


class _Loopback:
    """A `dist` for one process: sends return at once, a receive copies a fixed tensor (what
    gloo's receive writes; its CPU is the messages', which the model charges apart)."""

    def __init__(self) -> None:
        self.fixed: dict[tuple, torch.Tensor] = {}

    def send(self, t: torch.Tensor, dst: int) -> None:
        pass

    def recv(self, buf: torch.Tensor, src: int) -> None:
        key = (tuple(buf.shape), buf.dtype)
        if key not in self.fixed:
            self.fixed[key] = torch.randn(buf.shape).to(buf.dtype)
        buf.copy_(self.fixed[key])


def stage_seconds(model, x: torch.Tensor, stages: list[list[str]], s: int, micro: int,
                  reps: int = 30) -> tuple[float, float]:
    """(forward, backward) CPU seconds of one iteration of stage `s`, median of `reps`."""
    gm = fx.symbolic_trace(model)
    meta: dict[str, object] = {}

    class Rec(fx.Interpreter):
        def run_node(self, n):
            v = super().run_node(n)
            meta[n.name] = v.detach() if isinstance(v, torch.Tensor) else v
            return v

    with torch.no_grad():
        Rec(gm).run(x)
    st = Stage(gm, stages, s, meta)
    st.rows = x.shape[0]
    prev, nxt = (0 if s > 0 else None), (1 if s < len(stages) - 1 else None)
    dist, times = _Loopback(), []
    for i in range(reps + 3):
        gm.zero_grad(set_to_none=True)
        _, f, b = gpipe_passes(st, [[x]] * micro, prev, nxt, micro, dist,
                               clock=time.thread_time)
        if i >= 3:
            times.append((f, b))
    return tuple(statistics.median(t[k] for t in times) for k in range(2))


def _factor(raw: dict[str, TrainCost], graph, whole) -> dict[str, TrainCost]:
    """The old rule: one factor per phase."""
    fwd = sum(c.fwd for c in raw.values())
    k = whole[0] / fwd if fwd > 0 else 1.0
    fitted = fit_to_whole_step(raw, graph, whole)  # backward and step are the same
    return {n: TrainCost(k * raw[n].fwd, c.bwd_params, c.bwd_inputs, c.step)
            for n, c in fitted.items()}


def one_round(model, x, graph, micro: int) -> list[tuple]:
    """Per stage of every split: (first stage's nodes, s, nodes, raw, factor, per-node,
    alone), the last four as (forward, backward) ms per iteration."""
    names = [o.name for o in graph.ops]
    raw = op_train_costs(model, (x,), graph, 2, 7)
    whole = stage_seconds(model, x, [names], 0, micro)
    whole3 = (whole[0] / micro, whole[1] / micro, 0.0)
    rules = [raw, _factor(raw, graph, whole3), fit_to_whole_step(raw, graph, whole3)]
    rows = []
    for k in range(2, len(names) - 1):
        stages = [names[:k], names[k:]]
        stage_of = {op: i for i, ops in enumerate(stages) for op in ops}
        for s in (0, 1):
            alone = stage_seconds(model, x, stages, s, micro)
            charged = [tuple(micro * v * 1e3 for v in stage_costs(graph, stage_of, s, c)[:2])
                       for c in rules]
            nodes = sum(1 for n in stages[s] if graph.by_name()[n].kind != "placeholder")
            rows.append((k, s, nodes, *charged, tuple(v * 1e3 for v in alone)))
    return rows


def report(rows: list[tuple], split: int) -> list[str]:
    """Each rule's error per phase: rms over the stages, and the stages of `split`."""
    out = []
    for p, phase in enumerate(("forward", "backward")):
        alone = np.array([r[6][p] for r in rows])
        raw = np.array([r[3][p] for r in rows])
        nodes = np.array([r[2] for r in rows], dtype=float)
        coef, *_ = np.linalg.lstsq(np.stack([raw, nodes], 1), alone, rcond=None)
        preds = {"factor": np.array([r[4][p] for r in rows]),
                 "per-node": np.array([r[5][p] for r in rows]),
                 f"least squares ({coef[0]:.2f} x ops + {coef[1] * 1e3:.0f} us x nodes)":
                     raw * coef[0] + nodes * coef[1]}
        at = [i for i, r in enumerate(rows) if r[0] == split]
        for name, pred in preds.items():
            e = (pred - alone) / alone
            out.append(f"{phase:8s} {name}: rms {np.sqrt(np.mean(e ** 2)):.1%}, "
                       f"max {np.max(np.abs(e)):.1%}; split {split}: "
                       + ", ".join(f"stage {rows[i][1]} {e[i]:+.1%}" for i in at))
    return out


def main(job_file: str, batch: int, micro: int, rounds: int, split: int) -> int:
    torch.set_num_threads(1)
    job = load_job(job_file)
    graph = job_graph(job, batch)
    torch.manual_seed(0)
    model = build_model(job.model.catalog, job.model.params)
    x = example_inputs(job.model.catalog, job.model.params, batch)
    x = x[0] if isinstance(x, (tuple, list)) else x
    for r in range(rounds):
        rows = one_round(model, x, graph, micro)
        print(f"round {r + 1}: ms per iteration of {micro} micro-batches of {batch} rows "
              "(forward, backward): charged by raw ops / factor / per-node, and alone")
        for k, s, n, raw, fac, node, alone in rows:
            print(f"  split {k} stage {s} ({n} nodes): " + " / ".join(
                f"{a:.3f}, {b:.3f}" for a, b in (raw, fac, node)) + f" | alone {alone[0]:.3f}, "
                f"{alone[1]:.3f}")
        print("\n".join("  " + line for line in report(rows, split)), flush=True)
    return 0


def cli(argv: list[str] | None = None) -> int:
    """Parse the command line and run `main`."""
    ap = ArgumentParser(prog="python -m bench.placement.stage_fit", description=__doc__)
    ap.add_argument("--job", default="bench/hybrid/mlp-hybrid-job.yaml")
    ap.add_argument("--batch", type=int, default=64, help="rows of a micro-batch")
    ap.add_argument("--micro", type=int, default=2, help="micro-batches per iteration")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--split", type=int, default=4, help="the plan's split (nodes of stage 0)")
    a = ap.parse_args(argv)
    return main(a.job, a.batch, a.micro, a.rounds, a.split)


if __name__ == "__main__":
    sys.exit(cli())
