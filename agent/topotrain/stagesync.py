"""Gradient synchronisation of a pipeline stage's replicas, as the plan's per-stage `sync`
says (`topocontract.stages`): ``none`` (one replica), ``ring`` (one gloo all_reduce over the
stage's group), ``ps`` (a parameter server on one of the stage's ranks, gloo send/recv) or
``trees`` (the tree runtime's packed spanning trees over the stage's group).

Every replica's loss is already divided by (micro-batches x replicas)
(`topotrain.pipeline`), so the *sum* of the replicas' gradients is the gradient of the mean
loss over the global batch: every kind sums.

Parameter server (Li et al., OSDI'14, one shard): each worker sends its flat gradient to the
server (one gloo send of the whole buffer) and receives the sum back; the server posts one
receive per worker at once, sums its own buffer and the workers' in stage order (so the sum is
deterministic and the same bytes reach every replica), then sends it to all workers at once.
Traffic: 2(m - 1) S bytes through the server's links, two message rounds; the ring moves
2(m - 1)/m S per rank in 2(m - 1) rounds. Where the server's links are fat and the ring's
paths are thin (a star with slow cables between the leaves), or where round latency dominates
small gradients, the server wins; the planner decides by simulating both
(`topoctl.strategies.placement`). O(parameters) time and memory (one flat buffer, the
server m - 1 more). This module imports nothing of the controller."""

from __future__ import annotations

import torch

__all__ = ["flat_grads", "ps_sum", "sync_grads", "unflatten_into"]


def flat_grads(model) -> tuple[list, torch.Tensor | None]:
    """(parameters with a gradient, their gradients in one flat buffer, parameter order)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return params, None
    return params, torch.cat([p.grad.reshape(-1) for p in params])


def unflatten_into(params: list, flat: torch.Tensor) -> None:
    """Copy the flat buffer back into the parameters' gradients."""
    off = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n


def ps_sum(flat: torch.Tensor, ranks: list[int], server: int, rank: int, dist) -> None:
    """Sum `flat` over `ranks` in place through a parameter server on rank `server` (module
    docstring); every rank of `ranks` calls it with a buffer of the same size."""
    workers = [r for r in ranks if r != server]
    if rank != server:
        dist.send(flat, server)
        dist.recv(flat, server)
        return
    bufs = {r: torch.empty_like(flat) for r in workers}
    for w in [dist.irecv(bufs[r], r) for r in workers]:
        w.wait()
    # in stage order, the server's own buffer at its place: one summation order everywhere
    total = torch.zeros_like(flat)
    for r in ranks:
        total += flat if r == server else bufs[r]
    flat.copy_(total)
    for w in [dist.isend(flat, r) for r in workers]:
        w.wait()


def sync_grads(model, kind: str, ranks: list[int], server: int | None, rank: int, group,
               dist, schedule=None) -> None:
    """Sum the stage's gradients over its replicas (`ranks`, stage order) by `kind`; `group`:
    the stage's process group (ring, trees), `server`: the server's rank (ps), `schedule`:
    the stage's `TreeSchedule` (trees: the tree runtime over the group's ranks)."""
    if kind == "none" or len(ranks) < 2:
        return
    params, flat = flat_grads(model)
    if flat is None:
        return
    if kind == "ring":
        dist.all_reduce(flat, group=group)
    elif kind == "ps":
        ps_sum(flat, ranks, server, rank, dist)
    elif kind == "trees":
        from topotrain.collectives import tree_allreduce  # the tree runtime: only for trees

        tree_allreduce(flat, schedule, group=group)
    else:  # the plan was validated (topocontract.stages); a hand-edited one
        raise ValueError(f"unknown stage sync kind {kind!r}")
    unflatten_into(params, flat)
