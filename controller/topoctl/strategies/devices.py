"""Hosts with several ranks: the device nodes, the simulator network with the intra-host links,
the hierarchical AllReduce a data-parallel strategy runs over them, and the plan's contract
with the runtime (`hierarchical_collective`).

The contract (docs/multidevice.md "Hierarchical AllReduce"): when the hosts run k > 1 ranks,
`job.collective` carries ``hierarchical: {local_size: k}`` beside `algorithm` (ring | trees:
the inter-host part) and `order` (the host ring order). The runtime reduce-scatters among a
host's k ranks, all-reduces shard i among the ranks with local_rank i across the hosts (a ring
in host `order`, or the trees schedule over the hosts), then all-gathers inside the host."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from topoctl.collective.hierarchical import (
    ShardAlgorithm,
    device_node,
    hierarchical_allgather,
    hierarchical_allreduce,
    hierarchical_bound,
)
from topoctl.sim.devices import HostDevices, rail_hops, split_device, with_devices
from topoctl.sim.fabric import tcp_efficiency
from topoctl.sim.network import Network
from topoctl.sim.schedules import CollectiveAlgorithm, Schedule, ring_allgather

from . import PlanContext


def local_size(ctx: PlanContext) -> int:
    """Ranks per training host: k when every host runs k, 0 when they differ."""
    counts = {len(ctx.ranks[h]) for h in ctx.hosts}
    return counts.pop() if len(counts) == 1 else 0


def multi_rank(ctx: PlanContext) -> bool:
    """Whether some training host runs more than one rank."""
    return ctx.world_size != len(ctx.hosts)


def device_groups(ctx: PlanContext, order: Sequence[str] | None = None) -> list[list[str]]:
    """The device nodes of each host in `order` (default: the training hosts' order); a
    host of one rank is its own node."""
    return [[device_node(h, i) for i in range(len(ctx.ranks[h]))]
            if len(ctx.ranks[h]) > 1 else [h] for h in (order or ctx.hosts)]


def host_devices(ctx: PlanContext) -> dict[str, HostDevices]:
    """Every multi-rank training host's devices for the simulator: the cluster's intra-host
    link (`Cluster.device_link`) and, with rails, each device's first hop."""
    out = {}
    for h in ctx.hosts:
        k = len(ctx.ranks[h])
        if k < 2:
            continue
        link = ctx.cluster.device_link(h)
        nics = ctx.cluster.rails(h)
        rails = rail_hops(ctx.fabric, h, nics) if nics else None
        out[h] = HostDevices(k, link.bandwidth, link.latency, rails)
    return out


def device_network(ctx: PlanContext, network: Network) -> Network:
    """`network` with the multi-rank hosts' devices as nodes (`sim.devices.with_devices`);
    `network` itself when every host runs one rank."""
    devs = host_devices(ctx)
    return with_devices(network, devs) if devs else network


def hierarchical_algorithm(ctx: PlanContext, order: Sequence[str],
                           shard: ShardAlgorithm) -> tuple[CollectiveAlgorithm, list[str]]:
    """(algorithm, members) of the hierarchical AllReduce over the hosts in `order`: the
    algorithm ignores the members it is given (the bucket task's) and runs over every host's
    devices; `shard` is the inter-host part per shard. Every host must run the same count."""
    groups = device_groups(ctx, order)

    def algorithm(members: Sequence[str], size: float) -> Schedule:
        del members  # the groups are fixed by the plan
        return hierarchical_allreduce(groups, size, shard)

    return algorithm, [d for g in groups for d in g]


def hierarchical_collective(collective: dict[str, Any], k: int) -> dict[str, Any]:
    """The plan's `job.collective` for hosts of `k` ranks: `hierarchical: {local_size: k}`
    beside `algorithm` and `order` (module docstring); unchanged for k <= 1."""
    if k <= 1:
        return collective
    return collective | {"hierarchical": {"local_size": k}}


def hierarchical_note(ctx: PlanContext, size: float) -> dict[str, Any]:
    """What a plan reports about its hierarchical AllReduce of the whole gradient (`size`
    bytes): local size, the intra-host links and the scheme's bound in seconds
    (`collective.hierarchical.hierarchical_bound`, with the slowest intra-host link and the
    largest host NIC goodput: it holds for every host)."""
    k = local_size(ctx)
    kinds = sorted({ctx.cluster.device_link(h).kind for h in ctx.hosts})
    dev_bw = min(ctx.cluster.device_link(h).bandwidth for h in ctx.hosts)
    host_bw = max(host_goodput(ctx).values(), default=0.0)
    return {"local_size": k, "intra_links": kinds, "intra_bytes_per_s": dev_bw,
            "host_bytes_per_s": host_bw,
            "bound_s": hierarchical_bound(size, len(ctx.hosts), k, dev_bw, host_bw)}


def host_goodput(ctx: PlanContext) -> dict[str, float]:
    """Each training host's NICs together, in bytes/s of TCP goodput (every link it ends)."""
    eff = tcp_efficiency(ctx.fabric.mtu)
    out = dict.fromkeys(ctx.hosts, 0.0)
    for ln in ctx.fabric.links:
        for end in (ln.a, ln.b):
            if end in out:
                out[end] += eff * ln.capacity / 8
    return out


def rank_count_refusal(ctx: PlanContext, what: str) -> str:
    """A refusal's reason on hosts of several ranks, naming the cluster file's YAML path of
    the first host whose rank count stops it: ``what (cluster hosts[i].gpus.count: N)``,
    the first whose count differs from the first host's when they differ, else the first
    of several ranks."""
    names = [h.name for h in ctx.cluster.hosts]
    k0 = len(ctx.ranks[ctx.hosts[0]])
    first = next((h for h in ctx.hosts if len(ctx.ranks[h]) != k0),
                 next((h for h in ctx.hosts if len(ctx.ranks[h]) > 1), ctx.hosts[0]))
    i = names.index(first)
    where = (f"hosts[{i}].gpus.count" if ctx.cluster.hosts[i].gpus is not None
             else "defaults.gpus.count")
    return f"{what} (cluster {where}: {len(ctx.ranks[first])})"


def gather_algorithm(ctx: PlanContext, order: Sequence[str]
                     ) -> tuple[CollectiveAlgorithm, list[str]]:
    """(algorithm, members) of an all-gather over the hosts in `order`: gloo's ring over the
    hosts with one rank each; on hosts of k > 1 ranks the hierarchical all-gather
    (`collective.hierarchical.hierarchical_allgather`: across the hosts per local rank, then
    inside each host); hosts of different counts: a flat ring over every rank."""
    if not multi_rank(ctx):
        return ring_allgather, list(order)
    groups = device_groups(ctx, order)
    if local_size(ctx) == 0:
        return ring_allgather, [d for g in groups for d in g]

    def algorithm(members: Sequence[str], size: float) -> Schedule:
        del members  # the groups are fixed by the plan
        return hierarchical_allgather(groups, size)

    return algorithm, [d for g in groups for d in g]


def stage_device_groups(devices: Sequence[Sequence[str]], hosts_per_stage: int,
                        devices_per_stage: int) -> list[list[str]]:
    """The device sets of a pipeline's stages over a grid of hosts x local devices
    (`devices`: each host's device nodes, the hosts in rank order, every host the same
    count k): stage (a, b) takes the `hosts_per_stage` (g) hosts of block a and, on each of
    them, the `devices_per_stage` (q) local devices of block b; stages in the order (a, b),
    the local blocks of a host block before the next host block. A stage's members are
    host-major, which is ascending rank order (replica j = host j // q of the block, local
    device b q + j mod q).

    Replica j of consecutive stages: within a host block they share a host (the activations
    take the intra-host link); from one host block to the next, replica j moves to the same
    position of the next block's hosts, on the same local device when q = k (the rails of a
    rail-optimised fabric). With one device per host (q = k = 1) the stages are blocks of g
    hosts, as before devices were modelled. g must divide the hosts and q the devices;
    (H / g) (k / q) stages of g q replicas. O(H k)."""
    k = len(devices[0]) if devices else 0
    if (not devices or hosts_per_stage < 1 or devices_per_stage < 1
            or len(devices) % hosts_per_stage or k % devices_per_stage
            or any(len(d) != k for d in devices)):
        raise ValueError(f"{len(devices)} hosts of {k} devices do not split into stages of "
                         f"{hosts_per_stage} hosts x {devices_per_stage} devices")
    return [[d[i] for d in devices[a:a + hosts_per_stage]
             for i in range(b, b + devices_per_stage)]
            for a in range(0, len(devices), hosts_per_stage)
            for b in range(0, k, devices_per_stage)]


def stage_shapes(hosts: int, local: int) -> list[tuple[int, int]]:
    """The (hosts, devices) per stage a pipeline over `hosts` hosts of `local` devices tries
    (`stage_device_groups`): g dividing the hosts and q dividing the devices with at least
    two stages, g ascending, then q descending (whole hosts first: fewer stages, fewer
    replicas on a tie). One device per host: the g with H / g >= 2. O(divisors)."""
    gs = [g for g in range(1, hosts + 1) if hosts % g == 0]
    qs = [q for q in range(local, 0, -1) if local % q == 0]
    return [(g, q) for g in gs for q in qs if (hosts // g) * (local // q) >= 2]


def rank_of(ctx: PlanContext, node: str) -> int:
    """The global rank of a simulator node: a device node's (``h0/g1``: local rank 1 of h0),
    or a one-rank host's."""
    host, i = split_device(node)
    return ctx.ranks[host][i or 0]


def host_members(ctx: PlanContext, host: str) -> list[str]:
    """The simulator nodes of `host`'s ranks (its devices, or the host itself for one)."""
    return device_groups(ctx, [host])[0]
