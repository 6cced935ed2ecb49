"""The hierarchical AllReduce for hosts that run several ranks, and its DDP hook.

The plan's ``job.collective.hierarchical`` (contract: `topocontract.hierarchy`) over the
launch spec's processes. With k ranks per host and H hosts, a flat tensor of n elements is
summed in place in three steps (NCCL's and Blink's order):

1. ``reduce_scatter_tensor`` over the host's k ranks (a gloo subgroup): local rank i ends with
   the host's sum of shard i (n/k elements, the tensor padded to a multiple of k);
2. shard i summed over the H ranks of local rank i (one subgroup per local rank): a ring in
   the plan's host ``order`` (the group's own gloo ring when that order is the ring of
   ascending ranks, else a ring of point-to-point messages in that order), or the plan's
   trees over hosts (`tree_allreduce`, the schedule relabelled to the group's ranks);
3. ``all_gather_into_tensor`` over the host's k ranks.

Every rank creates every subgroup, in the same order (torch requires it). Cost: the inter-host
step moves 2 (H-1)/H * n/k elements per rank, the intra-host steps (k-1)/k * n each way.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at runtime
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from topocontract.hierarchy import Hierarchy, HierarchyError, relabel_schedule, ring_is_sorted
from topocontract.schedule import TreeSchedule, check_world_size
from topotrain.collectives.program import tree_allreduce

__all__ = ["HierarchicalAllReduce", "HierarchyHookState", "register_hierarchy_hook",
           "ring_allreduce"]


def ring_allreduce(flat: torch.Tensor, ring: list[int], group) -> None:
    """Sum the 1-D `flat` in place over `ring` (global ranks, in ring order, all in `group`)
    with the ring algorithm (reduce-scatter then all-gather, m-1 steps each, every rank
    sending to the next one in the ring and receiving from the previous one). O(n) per rank,
    2 (m-1) messages."""
    m = len(ring)
    if m == 1 or flat.numel() == 0:
        return
    pos = ring.index(dist.get_rank())
    right, left = ring[(pos + 1) % m], ring[(pos - 1) % m]
    chunks = list(torch.tensor_split(flat, m))
    tmp = torch.empty_like(chunks[0])
    for s in range(m - 1):  # reduce-scatter: chunk (pos+1) % m ends complete here
        out, into = chunks[(pos - s) % m], chunks[(pos - s - 1) % m]
        recv = tmp[: into.numel()]
        ops = [dist.P2POp(dist.isend, out, right, group), dist.P2POp(dist.irecv, recv, left, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        into.add_(recv)
    for s in range(m - 1):  # all-gather: pass the complete chunks around
        out, into = chunks[(pos + 1 - s) % m], chunks[(pos - s) % m]
        ops = [dist.P2POp(dist.isend, out, right, group), dist.P2POp(dist.irecv, into, left, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()


@dataclass
class HierarchicalAllReduce:
    """This rank's part of a hierarchical AllReduce: its host's group, its shard's group and
    the inter-host algorithm over the shard group. Build with `create` (collective: every
    rank of the default group must call it)."""

    hierarchy: Hierarchy
    host_group: object
    shard_group: object
    shard_ring: list[int]  # global ranks of this rank's shard group, in host order
    native_ring: bool  # the group's own ring is the plan's ring
    schedule: TreeSchedule | None  # trees: relabelled to the shard group's ranks

    @classmethod
    def create(cls, hierarchy: Hierarchy, schedule: TreeSchedule | None = None
               ) -> "HierarchicalAllReduce":
        """Create every subgroup (host groups, then shard groups, on every rank in the same
        order) and keep this rank's. HierarchyError when the hierarchy does not fit the
        running world or a trees plan lacks a schedule over its hosts."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if hierarchy.world_size != world:
            raise HierarchyError([("job.collective.hierarchical", f"{len(hierarchy.hosts)} "
                                   f"hosts x {hierarchy.local_size} ranks, but the job runs "
                                   f"{world} ranks")])
        j, i = hierarchy.locate(rank)
        hosts = [dist.new_group(list(hierarchy.host_ranks(h)), backend="gloo")
                 for h in range(len(hierarchy.hosts))]
        shards = [dist.new_group(list(hierarchy.shard_ranks(s)), backend="gloo")
                  for s in range(hierarchy.local_size)]
        ring = list(hierarchy.shard_ranks(i))
        # group rank g is the g-th smallest global rank of the group
        group_rank = {r: g for g, r in enumerate(sorted(ring))}
        relabelled = None
        if hierarchy.inter == "trees":
            if schedule is None:
                raise HierarchyError([("job.collective.schedule", "trees across hosts need "
                                       "the plan's schedule")])
            check_world_size(schedule, len(ring))
            relabelled = relabel_schedule(schedule, [group_rank[r] for r in ring])
        native = ring_is_sorted([group_rank[r] for r in ring])
        return cls(hierarchy, hosts[j], shards[i], ring, native, relabelled)

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        """Sum the contiguous 1-D `flat` over every rank, in place (the three steps)."""
        k, n = self.hierarchy.local_size, flat.numel()
        if n == 0:
            return flat
        per = -(-n // k)  # shard elements (the tensor padded to k shards)
        if k > 1:
            padded = torch.zeros(per * k, dtype=flat.dtype)
            padded[:n].copy_(flat)
            shard = torch.empty(per, dtype=flat.dtype)
            dist.reduce_scatter_tensor(shard, padded, group=self.host_group)
        else:
            padded, shard = flat, flat
        self._across_hosts(shard)
        if k > 1:
            dist.all_gather_into_tensor(padded, shard, group=self.host_group)
            flat.copy_(padded[:n])
        return flat

    def _across_hosts(self, shard: torch.Tensor) -> None:
        """Step 2: `shard` summed over the ranks of this local rank on every host."""
        if len(self.shard_ring) == 1:
            return
        if self.schedule is not None:
            tree_allreduce(shard, self.schedule, self.shard_group)
        elif self.native_ring:
            dist.all_reduce(shard, group=self.shard_group)
        else:
            ring_allreduce(shard, self.shard_ring, self.shard_group)


@dataclass
class HierarchyHookState:
    """The DDP hook's state: the AllReduce, the world size it averages over and one worker
    thread (buckets reduced one after another in DDP's order, the same on every rank)."""

    allreduce: HierarchicalAllReduce
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="hier-allreduce"))
    # per bucket since the last `take_timings`: (bytes, s waiting for the thread, s of it)
    timings: list = field(default_factory=list)

    def take_timings(self) -> list[tuple[int, float, float]]:
        """The buckets' timings since the last call, and forget them."""
        out, self.timings = self.timings, []
        return out


def hierarchy_hook(
    state: HierarchyHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: average `bucket` over all ranks with the hierarchical AllReduce."""
    buf = bucket.buffer()
    fut: torch.futures.Future = torch.futures.Future()
    handed = time.perf_counter()

    def work() -> None:
        try:
            start = time.perf_counter()
            state.allreduce(buf)
            state.timings.append((buf.numel() * buf.element_size(), start - handed,
                                  time.perf_counter() - start))
            buf.div_(state.allreduce.hierarchy.world_size)
            fut.set_result(buf)
        except BaseException as exc:  # noqa: BLE001 - handed to DDP through the future
            fut.set_exception(exc)

    state.executor.submit(work)
    return fut


def register_hierarchy_hook(model: torch.nn.parallel.DistributedDataParallel,
                            hierarchy: Hierarchy, schedule: TreeSchedule | None = None
                            ) -> HierarchyHookState:
    """Create the subgroups (collective) and register the hook on `model`."""
    state = HierarchyHookState(HierarchicalAllReduce.create(hierarchy, schedule))
    model.register_comm_hook(state, hierarchy_hook)
    return state
