"""TAG's prior: message passing over the joint graph, a decoder that scores each action.

After TAG (Zhang et al., "Expediting Distributed DNN Training with Device Topology-Aware Graph
Deployment", IEEE TPDS 2023; their GNN: GAT-style layers with edge features per edge kind).
Plain torch, no graph library: each layer sends, per edge kind (data flow both ways, links,
placement both ways), a message MLP([h_src, e]) along every edge, averages them per
destination and kind, and updates h <- LayerNorm(h + ReLU(W [h, sum of kind means])). The
decoder scores an action from its group's embedding, the mean embedding of its hosts, the
server's, a one-hot of its type and context numbers (`features.ActionDesc`); the prior is the
softmax over the legal actions. It never predicts time: the simulator does.

Trained on the search's own visit distributions (cross-entropy to the visit shares, as TAG
and AlphaZero do) by `fit`. Deterministic for a seed on one thread. Cost: O(layers * (nodes +
edges) * hidden^2) per graph, O(actions * hidden^2) per decision.
"""

from __future__ import annotations

import base64

import numpy as np
import torch
from torch import nn

from topoctl.tag.features import CTX_DIM, GROUP_DIM, HOST_DIM, TYPES, ActionDesc, JointGraph

HIDDEN = 16
LAYERS = 3
KINDS = ("flow", "flow_rev", "link", "place", "place_rev")


def _mlp(i: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Linear(o, o))


class Layer(nn.Module):
    """One message-passing layer over both node sets (module docstring)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.msg = nn.ModuleDict({k: _mlp(hidden + 1, hidden) for k in KINDS})
        self.up_g = nn.Linear(3 * hidden, hidden)
        self.up_h = nn.Linear(3 * hidden, hidden)
        self.norm_g, self.norm_h = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

    def forward(self, hg, hh, edges):
        agg = {}
        for k, (src_is_g, dst_is_g, src, dst, feat) in edges.items():
            hs = hg if src_is_g else hh
            n_dst = hg.shape[0] if dst_is_g else hh.shape[0]
            out = torch.zeros(n_dst, hg.shape[1])
            if src.numel():
                m = self.msg[k](torch.cat([hs[src], feat[:, None]], dim=1))
                out = out.index_add(0, dst, m)
                cnt = torch.zeros(n_dst).index_add(0, dst, torch.ones(len(dst))).clamp(min=1)
                out = out / cnt[:, None]
            agg[k] = out
        g_in = torch.cat([hg, agg["flow"], agg["flow_rev"] + agg["place_rev"]], dim=1)
        h_in = torch.cat([hh, agg["link"], agg["place"]], dim=1)
        return (self.norm_g(hg + torch.relu(self.up_g(g_in))),
                self.norm_h(hh + torch.relu(self.up_h(h_in))))


class TagNet(nn.Module):
    """Encoder (node features -> hidden), `LAYERS` message-passing layers, action decoder."""

    def __init__(self, hidden: int = HIDDEN, layers: int = LAYERS):
        super().__init__()
        self.enc_g, self.enc_h = nn.Linear(GROUP_DIM, hidden), nn.Linear(HOST_DIM, hidden)
        self.layers = nn.ModuleList(Layer(hidden) for _ in range(layers))
        self.dec = nn.Sequential(nn.Linear(3 * hidden + len(TYPES) + CTX_DIM, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 1))

    def embed(self, jg: JointGraph) -> tuple[torch.Tensor, torch.Tensor]:
        """Group and host embeddings of a joint graph."""
        hg = self.enc_g(torch.tensor(jg.group_x, dtype=torch.float32))
        hh = self.enc_h(torch.tensor(jg.host_x, dtype=torch.float32))
        edges = _edges(jg)
        for layer in self.layers:
            hg, hh = layer(hg, hh, edges)
        return hg, hh

    def scores(self, hg: torch.Tensor, hh: torch.Tensor, acts: list[ActionDesc]) -> torch.Tensor:
        """One logit per action."""
        zero = torch.zeros(hh.shape[1])
        rows = []
        for a in acts:
            onehot = torch.zeros(len(TYPES))
            onehot[a.kind] = 1.0
            hosts = hh[list(a.hosts)].mean(0)
            server = hh[a.server] if a.server >= 0 else zero
            rows.append(torch.cat([hg[a.group], hosts, server, onehot,
                                   torch.tensor(a.ctx, dtype=torch.float32)]))
        return self.dec(torch.stack(rows)).squeeze(1)


def _edges(jg: JointGraph) -> dict:
    """Per kind: (source is a group, destination is a group, src, dst, feature)."""
    def t(rows, i):
        return torch.tensor([r[i] for r in rows], dtype=torch.long if i < 2 else torch.float32)
    f, lk, p = jg.flow, jg.link, jg.place
    return {"flow": (True, True, t(f, 0), t(f, 1), t(f, 2)),
            "flow_rev": (True, True, t(f, 1), t(f, 0), t(f, 2)),
            "link": (False, False, t(lk, 0), t(lk, 1), t(lk, 2)),
            "place": (True, False, t(p, 0), t(p, 1), t(p, 2)),
            "place_rev": (False, True, t(p, 1), t(p, 0), t(p, 2))}


Sample = tuple[int, list[ActionDesc], list[float]]  # (graph index, actions, visit shares)


def fit(graphs: list[JointGraph], samples: list[Sample], seed: int, epochs: int,
        lr: float = 3e-3, net: TagNet | None = None, progress=None) -> tuple[TagNet, list[float]]:
    """Train (a copy of `net` or a fresh net from `seed`) by cross-entropy to the visit
    shares, full batch per graph, Adam; the mean loss per epoch. Deterministic for a seed."""
    torch.manual_seed(seed)
    model = TagNet()
    if net is not None:
        model.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    by_graph: dict[int, list[Sample]] = {}
    for s in samples:
        by_graph.setdefault(s[0], []).append(s)
    losses = []
    for ep in range(epochs):
        total, n = 0.0, 0
        for gi in sorted(by_graph):
            opt.zero_grad()
            hg, hh = model.embed(graphs[gi])
            loss = torch.zeros(())
            for _, acts, target in by_graph[gi]:
                logp = torch.log_softmax(model.scores(hg, hh, acts), 0)
                loss = loss - (torch.tensor(target) * logp).sum()
            loss = loss / len(by_graph[gi])
            loss.backward()
            opt.step()
            total, n = total + float(loss.detach()), n + 1
        losses.append(total / max(1, n))
        if progress is not None:
            progress(ep + 1, epochs, losses[-1])
    return model, losses


def to_plain(net: TagNet) -> dict[str, str]:
    """The weights as plain data (JSON): per tensor, its float32 little-endian bytes in
    base64, in a fixed key order (exact, and the same bytes for the same weights)."""
    return {k: base64.b64encode(v.detach().to(torch.float32).contiguous().numpy()
                                .astype("<f4").tobytes()).decode()
            for k, v in sorted(net.state_dict().items())}


def from_plain(data: dict[str, str]) -> TagNet:
    """A TagNet from `to_plain`'s data (ValueError when it does not match the architecture)."""
    net = TagNet()
    sd = net.state_dict()
    if set(sd) != set(data):
        raise ValueError("weights do not match the TAG network (retrain: topoctl tag train)")
    out = {}
    for k in sd:
        arr = np.frombuffer(base64.b64decode(data[k]), dtype="<f4")
        if arr.size != sd[k].numel():
            raise ValueError(f"weights for {k} do not match the TAG network (retrain)")
        out[k] = torch.from_numpy(arr.copy()).reshape(sd[k].shape)
    net.load_state_dict(out)
    net.eval()
    return net
