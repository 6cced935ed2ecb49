"""BERT-style Transformer encoder (Devlin et al., NAACL'19), written out with nn.Linear so that
torch.fx traces every matmul (no fused attention kernels)."""

from __future__ import annotations

import math

import torch
from torch import nn


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.dh = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.scale = 1.0 / math.sqrt(self.dh)

    def forward(self, x):
        b, s, h = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, h)
        return self.out(y)


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.att = _Attention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.ff2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x):
        x = self.ln1(x + self.att(x))
        return self.ln2(x + self.ff2(self.act(self.ff1(x))))


class BertEncoder(nn.Module):
    """BERT-style encoder: embeddings, `layers` Transformer blocks and an untied output head."""

    def __init__(self, layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 0,
                 seq: int = 128, vocab: int = 30522):
        super().__init__()
        if hidden % heads:
            raise ValueError("hidden must be a multiple of heads")
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.zeros(1, seq, hidden))
        self.ln = nn.LayerNorm(hidden)
        self.layers = nn.Sequential(*[_Layer(hidden, heads, ffn or 4 * hidden)
                                      for _ in range(layers)])
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        x = self.ln(self.tok(ids) + self.pos)
        return self.head(self.layers(x))
