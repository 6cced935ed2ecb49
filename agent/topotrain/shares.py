"""Batch shares by speed in the ranks (HAP's DP-CP baseline): rank r takes ``shares[r]`` of
the global batch's samples (the plan's ``job.batch.shares``) and scales its loss so that the
AllReduce average is the gradient of one process on the whole batch.

Each rank's loss is the mean over its own samples, L_r = (1/n_r) sum_i l_i; the whole batch's
is L = (1/N) sum_r n_r L_r. DDP (and the tree hook) average the ranks' gradients, (1/P) sum_r
g_r, so rank r back-propagates ``P n_r / N * L_r``: the average is then exactly grad L. With
even shares (n_r = N / P) the weight is 1 and nothing changes."""

from __future__ import annotations

from topoagent.state.wire import Batch


def loss_weight(batch: Batch, rank: int, world: int) -> float:
    """What rank `rank` of `world` multiplies its mean loss by before the backward pass: ``world
    * share / global`` (1.0 without shares)."""
    if batch.shares is None:
        return 1.0
    return world * batch.shares[rank] / batch.global_
