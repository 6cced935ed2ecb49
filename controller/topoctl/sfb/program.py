"""Sufficient-factor broadcasting (SFB): which fully connected layers to synchronise by
broadcasting their gradients' factors instead of all-reducing the gradients.

A fully connected layer y = x W^T + b has the weight gradient grad W = sum over samples of
d_s x_s^T (d = dL/dy, x the input): a sum of outer products, so each replica can broadcast its
K samples' factors (x: K x M, d: K x N) and every replica rebuilds the summed gradient itself
(Xie et al., "Lighter-communication distributed machine learning via sufficient factor
broadcasting", UAI'16; per layer in Poseidon, Zhang et al., USENIX ATC'17; as an op-level 0/1
program in TAG, Zhang et al., "Expediting distributed DNN training with device
topology-aware graph deployment", TPDS'23). With P replicas a replica receives about
K (P - 1)(M + N) values against about 2 M N for a ring AllReduce of the M x N gradient: SFB
wins for small per-replica batches and wide layers (K P << M N / (M + N)).

`choose_layers` is TAG's program with our own rates: a binary x_i per candidate layer (SFB or
not) and b_e per factor tensor (broadcast or not; a tensor two layers read is broadcast once),

    minimise   sum_i x_i (extra_i - saved_i) + sum_e b_e gather_e
    subject to x_i <= b_e  for every factor e of layer i,

where extra_i is the compute a replica adds to rebuild layer i's gradient from every replica's
factors, saved_i the AllReduce time of its gradient bytes, and gather_e the all-gather time of
tensor e; all three come from the caller (the plan's own network and op costs,
`topoctl.strategies.sfb`). Its constraint matrix (one row x_i - b_e <= 0 each) is totally
unimodular, so the LP relaxation is integral: the program is a maximum-weight closure problem
(Picard, Management Science 1976), solved to its optimum (the bound it reaches is the optimum
itself) by HiGHS (`scipy.optimize.milp`) at the root, in polynomial time in layers + tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


@dataclass(frozen=True)
class SfbLayer:
    """One candidate layer: its name, the ids of the factor tensors it needs from every
    replica (its input, its output gradient), the seconds a replica adds to rebuild its summed
    gradient from all replicas' factors (`extra_s`) and the seconds of AllReduce its gradient
    costs today (`saved_s`)."""

    name: str
    factors: tuple[str, ...]
    extra_s: float
    saved_s: float


@dataclass(frozen=True)
class SfbChoice:
    """The program's answer: layers synchronised by SFB (in the order given), the tensors
    all-gathered, and the objective (seconds; negative: SFB saves that much)."""

    layers: tuple[str, ...]
    tensors: tuple[str, ...]
    objective: float


def factor_values(k: int, p: int, m: int, n: int) -> tuple[int, int]:
    """(values one replica receives with SFB, values it sends and receives in a ring
    AllReduce) for an m x n layer with k samples per replica on p replicas: k (p - 1)(m + n)
    against 2 (p - 1) / p * m n (each rounded down)."""
    return k * (p - 1) * (m + n), 2 * (p - 1) * m * n // p


def choose_layers(layers: Sequence[SfbLayer], gather_s: Mapping[str, float]) -> SfbChoice:
    """The layers worth synchronising by SFB: the optimum of the 0/1 program above
    (`gather_s`: seconds to all-gather each factor tensor). O(poly(layers + tensors)) (an
    integral LP); no candidates: nothing chosen."""
    tensors = sorted({e for ly in layers for e in ly.factors})
    if not layers:
        return SfbChoice((), (), 0.0)
    missing = [e for e in tensors if e not in gather_s]
    if missing:
        raise ValueError(f"no all-gather time for tensor(s) {', '.join(missing)}")
    nl, col = len(layers), {e: len(layers) + j for j, e in enumerate(tensors)}
    cost = np.array([ly.extra_s - ly.saved_s for ly in layers]
                    + [gather_s[e] for e in tensors], dtype=float)
    rows = [(i, col[e]) for i, ly in enumerate(layers) for e in ly.factors]
    a = np.zeros((len(rows), len(cost)))
    for r, (i, j) in enumerate(rows):
        a[r, i], a[r, j] = 1.0, -1.0
    res = milp(cost, constraints=[LinearConstraint(a, -np.inf, 0.0)],
               integrality=np.ones(len(cost)), bounds=Bounds(0.0, 1.0))
    if res.x is None:  # cannot happen (x = 0 is feasible); guard against a solver failure
        raise RuntimeError(f"HiGHS found no solution of the SFB program: {res.message}")
    x = np.round(res.x).astype(int)
    chosen = tuple(ly.name for i, ly in enumerate(layers) if x[i])
    sent = tuple(e for e in tensors if x[col[e]] and any(
        x[i] for i, ly in enumerate(layers) if e in ly.factors))
    objective = float(sum(cost[i] for i in range(nl) if x[i])
                      + sum(gather_s[e] for e in sent))
    return SfbChoice(chosen, sent, objective)
