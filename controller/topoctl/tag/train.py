"""Self-play training of TAG's prior on the simulator (`topoctl tag train`).

As TAG (Zhang et al., IEEE TPDS 2023) trains its GNN: run the search on training cases, keep
every well-visited node's visit distribution, fit the network to it by cross-entropy, search
again with the new prior, and so on for `rounds` (samples of every round kept). The cases are
catalog models (`TRAIN_MODELS`) on generated clusters (`topoctl.tag.clusters`) of
`TRAIN_HOSTS` hosts, GPU and CPU, direct and switched; held out for evaluation 2:
`HELD_OUT_MODELS` and clusters of other host counts. Deterministic for a seed on one torch
thread (the searches are deterministic and the contexts use roofline costs, no machine
timings). The caller (`topoctl tag train`, `topoctl.cli.tag`) builds the planner contexts of
the cases (capturing models: I/O, minutes of CPU) and passes them in with the `Kit` of the other
strategies' functions: this package never imports the planner or the strategies registry. The
learning is `gnn.fit`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from topoctl.tag.clusters import generated
from topoctl.tag.features import JointGraph, describe_action
from topoctl.tag.gnn import Sample, TagNet, fit
from topoctl.tag.kit import Kit
from topoctl.tag.search import run_search

TRAIN_MODELS = (("mlp", 512), ("vgg", 256))  # (catalog model, global batch)
HELD_OUT_MODELS = (("resnet", 256), ("bert", 64))
TRAIN_HOSTS = 4
SEARCH_GROUPS = 12  # op-groups per training search (the planner's default is 24)


def job_doc(model: str, batch: int) -> dict:
    """A job file of catalog `model` at global `batch`, roofline costs (float16 GPUs)."""
    return {"apiVersion": "topoctl/v1", "kind": "Job", "name": "tag-train",
            "model": {"catalog": model}, "batch": {"global": batch}, "dtype": "float16",
            "cost": {"method": "roofline"}}


def case_docs(clusters: int, seed: int, hosts: int = TRAIN_HOSTS,
              models=TRAIN_MODELS) -> list[tuple[dict, dict]]:
    """(cluster doc, job doc) pairs: `clusters` generated clusters x `models`; cluster i is
    drawn with seed ``seed * 1000 + i`` (GPU for even i, CPU for odd)."""
    out = []
    for i in range(clusters):
        c = generated(hosts, seed * 1000 + i, compute="gpu" if i % 2 == 0 else "cpu")
        out += [(c, job_doc(m, b)) for m, b in models]
    return out


@dataclass
class Trained:
    """The trained network, the loss per epoch (all rounds), the samples per round."""

    net: TagNet
    losses: list[float]
    samples: list[int]


Progress = Callable[[str], None]


def self_play(ctxs: list, kit: Kit, rounds: int, playouts: int, epochs: int, seed: int,
              progress: Progress | None = None) -> Trained:
    """`rounds` of search (the first with the uniform prior) and fitting (module docstring):
    `ctxs` the planner contexts of the cases (roofline, no caches), `kit` the other
    strategies' functions the search composes (`topoctl.tag.kit`)."""
    torch.set_num_threads(1)
    say = progress or (lambda m: None)
    graphs: list[JointGraph] = []
    samples: list[Sample] = []
    losses: list[float] = []
    counts: list[int] = []
    net: TagNet | None = None
    for r in range(rounds):
        for ci, ctx in enumerate(ctxs):
            out = run_search(ctx, kit, playouts, seed=seed + ci, net=net, max_groups=SEARCH_GROUPS,
                             use_anchors=False)
            if r == 0:
                graphs.append(out.graph)
            for state, acts, visits in out.result.targets:
                if len(acts) < 2:
                    continue
                total = sum(visits)
                descs = [describe_action(out.space, out.graph, state, a) for a in acts]
                samples.append((ci, descs, [v / total for v in visits]))
            say(f"round {r + 1}/{rounds}: case {ci + 1}/{len(ctxs)} searched, "
                f"{len(samples)} samples, best {out.base_time / out.time:.3g}x the baseline")
        counts.append(len(samples))

        def ep(done: int, total: int, loss: float, r=r) -> None:
            if done == total or done % max(1, total // 5) == 0:
                say(f"round {r + 1}/{rounds}: epoch {done}/{total}, loss {loss:.4f}")
        net, ls = fit(graphs, samples, seed + r, epochs, net=net, progress=ep)
        losses += ls
    assert net is not None
    return Trained(net, losses, counts)


def loss_png(losses: list[float], rounds: int, path: str) -> None:
    """The loss per epoch as a PNG (one line; round boundaries marked)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(range(1, len(losses) + 1), losses, lw=1.5)
    per = len(losses) // max(1, rounds)
    for r in range(1, rounds):
        ax.axvline(r * per + 0.5, color="grey", ls=":", lw=1)
    ax.set_xlabel("epoch (dotted: a new round of self-play)")
    ax.set_ylabel("cross-entropy to visit shares")
    ax.set_title("TAG prior: self-play training loss")
    fig.tight_layout()
    # PNG whatever the name ends in (matplotlib picks the format by the suffix and refuses an
    # unknown one, after the training has run)
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
