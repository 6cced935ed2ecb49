"""The GNN prior for TAG's search: the shipped weights and the prior function over a space.

`shipped` reads the weights that ship in the package (`weights.json`, written by
``topoctl tag train``; planning never trains); `net_prior` embeds the joint graph once and
returns the prior MCTS calls at each expanded node: the softmax of the decoder's scores over
the legal actions (TAG, Zhang et al., IEEE TPDS 2023). O(graph) once, O(actions) per node.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from topoctl.tag.features import JointGraph, describe_action
from topoctl.tag.gnn import TagNet, from_plain
from topoctl.tag.space import Space

WEIGHTS = Path(__file__).with_name("weights.json")


@lru_cache(maxsize=1)
def shipped() -> TagNet:
    """The shipped network (ValueError naming the file when it is missing or does not match)."""
    try:
        data = json.loads(WEIGHTS.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{WEIGHTS}: cannot read the TAG weights ({e}); retrain with "
                         "`topoctl tag train` or plan with tag.prior: uniform") from None
    return from_plain(data["weights"])


def net_prior(net: TagNet, space: Space, jg: JointGraph):
    """The prior function of `net` on one job (`topoctl.tag.mcts.Prior`)."""
    torch.set_num_threads(1)
    with torch.no_grad():
        hg, hh = net.embed(jg)

    def prior(state: tuple, actions: list) -> list[float]:
        if len(actions) == 1:
            return [1.0]
        descs = [describe_action(space, jg, state, a) for a in actions]
        with torch.no_grad():
            return torch.softmax(net.scores(hg, hh, descs), 0).tolist()
    return prior
