"""A small graph neural network predicting a fused region's time from its ops (DisCo's
simulator, Chen et al., TPDS: a GNN over the fused kernel's op graph), in plain torch message
passing.

Node features per op: its category (one-hot, `model.CATEGORIES`), log FLOPs forward and
backward, log bytes in/out and of parameters; edges: data flow inside the region. Three rounds
of h_v <- relu(W_s h_v + W_in mean(h_u, u -> v) + W_out mean(h_w, v -> w)), a sum and a mean
readout, plus log(t_eager) and log(n), into an MLP predicting log(t_fused / t_eager). Trained
with Adam on squared log error (deterministic for a seed, one thread). Cost per forward:
O(rounds x (ops + edges) x hidden^2)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from topoctl.disco.fusion.model import CATEGORIES, category, compute_ops

HIDDEN = 32
ROUNDS = 3


def node_features(ops: list[dict]) -> torch.Tensor:
    """One row per op: category one-hot, then the logs of FLOPs (fwd, bwd) and bytes (in,
    out, parameters), scaled to about [0, 1]."""
    rows = []
    for o in ops:
        onehot = [1.0 if category(o["kind"]) == c else 0.0 for c in CATEGORIES]
        logs = [math.log1p(o[k]) / 25.0 for k in ("flops", "bwd_flops", "in_bytes",
                                                   "out_bytes", "param_bytes")]
        rows.append(onehot + logs)
    return torch.tensor(rows, dtype=torch.float32)


def adjacency(ops: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean over predecessors, mean over successors) as dense row-normalised matrices."""
    n = len(ops)
    a = torch.zeros(n, n)
    for v, o in enumerate(ops):
        for u in o["inputs"]:
            a[v, u] = 1.0
    norm_in = a / a.sum(1, keepdim=True).clamp(min=1.0)
    at = a.t()
    norm_out = at / at.sum(1, keepdim=True).clamp(min=1.0)
    return norm_in, norm_out


class RegionGNN(nn.Module):
    """The message-passing network (see the module doc)."""

    def __init__(self, features: int = len(CATEGORIES) + 5, hidden: int = HIDDEN):
        super().__init__()
        self.embed = nn.Linear(features, hidden)
        self.rounds = nn.ModuleList(nn.ModuleList(nn.Linear(hidden, hidden, bias=b)
                                                  for b in (True, False, False))
                                    for _ in range(ROUNDS))
        self.head = nn.Sequential(nn.Linear(2 * hidden + 2, hidden), nn.ReLU(),
                                  nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor, a_in: torch.Tensor, a_out: torch.Tensor,
                glob: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x))
        for w_self, w_in, w_out in self.rounds:
            h = torch.relu(w_self(h) + w_in(a_in @ h) + w_out(a_out @ h))
        return self.head(torch.cat([h.sum(0) / 10.0, h.mean(0), glob])).squeeze(-1)


def _encode(ops: list[dict], eager_s: float) -> tuple[torch.Tensor, ...]:
    a_in, a_out = adjacency(ops)
    glob = torch.tensor([math.log(eager_s) / 10.0, math.log1p(compute_ops(ops)) / 5.0])
    return node_features(ops), a_in, a_out, glob


@dataclass
class GnnModel:
    """A trained `RegionGNN` with the `predict(ops, eager_s)` of the other cost models."""

    net: RegionGNN

    def predict(self, ops: list[dict], eager_s: float) -> float:
        """Seconds of the fused region."""
        with torch.no_grad():
            return eager_s * math.exp(float(self.net(*_encode(ops, eager_s))))

    @classmethod
    def fit(cls, samples: list[dict], epochs: int = 300, seed: int = 0, lr: float = 3e-3
            ) -> GnnModel:
        """Trained on `samples` (``ops``, ``eager_s``, ``fused_s``): Adam, full batch,
        squared error of log(t_fused / t_eager), weight decay 1e-4."""
        torch.manual_seed(seed)
        net = RegionGNN()
        data = [(_encode(s["ops"], s["eager_s"]), math.log(s["fused_s"] / s["eager_s"]))
                for s in samples]
        opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-4)
        for _ in range(epochs):
            opt.zero_grad()
            loss = sum((net(*enc) - y) ** 2 for enc, y in data) / len(data)
            loss.backward()
            opt.step()
        return cls(net.eval())
