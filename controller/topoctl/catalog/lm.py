"""A decoder-only transformer language model (GPT-2 style: Radford et al. 2019; the layer
layout Megatron-LM splits, Shoeybi et al. 2019), written out with nn.Linear so that torch.fx
traces every matmul and tensor parallelism can split each projection.

Per block: pre-LayerNorm causal self-attention with separate q/k/v projections (column
parallel: each device holds some heads) and an output projection (row parallel), then a
pre-LayerNorm MLP of `ffn` (default 4*hidden) with fc1 column and fc2 row parallel. The head
count of the attention is read from the projections' width, so the same code runs on a
device holding any number of whole heads. Parameters: about 12*layers*hidden^2 plus
vocab*hidden (embedding and head, untied). `SIZES` names the usual sizes for plans; the
defaults are lab-tiny and train on a CPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["SIZES", "DecoderLM"]

# name -> (layers, hidden, heads): GPT-3 / Llama-like shapes for planning
SIZES = {"1.3b": (24, 2048, 16), "7b": (32, 4096, 32), "13b": (40, 5120, 40),
         "70b": (80, 8192, 64)}


class CausalSelfAttention(nn.Module):
    """Causal multi-head attention; `head_dim` fixed, the number of heads from q's width."""

    def __init__(self, hidden: int, heads: int, seq: int):
        super().__init__()
        self.head_dim = hidden // heads
        # the causal mask as a buffer: torch.fx cannot trace a tensor built from traced sizes
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(),
                             persistent=False)
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        att = att.masked_fill(~self.causal, float("-inf"))  # inputs are `seq` long
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, -1)
        return self.out(y)


class Block(nn.Module):
    """One decoder block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, hidden: int, heads: int, ffn: int, seq: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads, seq)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class DecoderLM(nn.Module):
    """Token and position embeddings, `layers` decoder blocks, a final LayerNorm and an
    untied head over the vocabulary (logits per position)."""

    def __init__(self, layers: int = 2, hidden: int = 64, heads: int = 4, ffn: int = 0,
                 seq: int = 32, vocab: int = 256):
        super().__init__()
        if hidden % heads:
            raise ValueError("hidden must be a multiple of heads")
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.zeros(1, seq, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn or 4 * hidden, seq)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))
