"""Dense and recommendation models: MLP, CANDLE-Uno-style dense net (Xia et al., BMC Bioinf.'18),
DLRM-style embedding tables + MLPs (Naumov et al., arXiv 1906.00091)."""

from __future__ import annotations

import torch
from torch import nn


def _mlp(widths: list[int], last_relu: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class MLP(nn.Module):
    """A multi-layer perceptron: `layers` hidden layers of `hidden` units with ReLU."""

    def __init__(self, layers: int = 4, hidden: int = 1024, features: int = 784,
                 classes: int = 10):
        super().__init__()
        self.net = _mlp([features] + [hidden] * layers + [classes])

    def forward(self, x):
        return self.net(x)


class CandleUno(nn.Module):
    """Feature towers per input (gene expression, drug descriptors, fingerprints), concatenated
    into a deep dense regression head."""

    def __init__(self, gene: int = 942, drug: int = 5270, fingerprint: int = 2048,
                 tower: int = 1000, tower_layers: int = 3, hidden: int = 1000, layers: int = 5):
        super().__init__()
        self.gene = _mlp([gene] + [tower] * tower_layers, last_relu=True)
        self.drug = _mlp([drug] + [tower] * tower_layers, last_relu=True)
        self.fp = _mlp([fingerprint] + [tower] * tower_layers, last_relu=True)
        self.head = _mlp([3 * tower] + [hidden] * layers + [1])

    def forward(self, gene, drug, fp):
        return self.head(torch.cat([self.gene(gene), self.drug(drug), self.fp(fp)], dim=1))


class DLRM(nn.Module):
    """Dense features through a bottom MLP, sparse features through embedding tables, pairwise
    dot-product interaction, top MLP."""

    def __init__(self, tables: int = 8, rows: int = 100000, dim: int = 64, dense: int = 13,
                 bottom: int = 512, top: int = 1024, mlp_layers: int = 3):
        super().__init__()
        self.bottom = _mlp([dense] + [bottom] * (mlp_layers - 1) + [dim], last_relu=True)
        self.emb = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        n = tables + 1
        self.top = _mlp([dim + n * (n - 1) // 2] + [top] * (mlp_layers - 1) + [1])
        self.register_buffer("_iu", torch.triu_indices(n, n, 1), persistent=False)

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        feats = [x] + [e(sparse[:, i]) for i, e in enumerate(self.emb)]
        t = torch.stack(feats, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        inter = z[:, self._iu[0], self._iu[1]]
        return self.top(torch.cat([x, inter], dim=1))
