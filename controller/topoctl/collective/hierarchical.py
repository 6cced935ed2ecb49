"""Hierarchical AllReduce over hosts with several devices (NCCL's and Blink's two-level scheme;
Wang et al., "Blink: Fast and Generic Collectives for Distributed ML", MLSys'20; NCCL's
CollNet/"tree of rings"; BlueConnect, Cho et al. 2019).

For H hosts of k devices each and S bytes:

1. reduce-scatter inside every host over its intra-host link (a ring of its k devices, k-1
   rounds of S/k): device i of the host holds the host's sum of shard i;
2. AllReduce of shard i (S/k bytes) among the devices of local index i across the hosts, one
   inter-host collective per shard, all k at once (a ring in host order, or packed trees): they
   share the host's NICs, or with rails each runs on its own NIC;
3. all-gather inside every host (k-1 rounds of S/k).

Bound (stated in docs/multidevice.md "Hierarchical AllReduce"): with B_dev the intra-host
bandwidth per device and direction and B_host the goodput of a host's NICs together, the
phases run one after another per buffer, so the scheme takes at least

    T_hier >= 2 (k-1)/k * S / B_dev  +  2 (H-1)/H * S / B_host      (`hierarchical_bound`)

The second term is the classic AllReduce bound among H hosts (every host's NICs carry S in
total, as in the flat ring: k shards of S/k); the first, the intra-host reduce-scatter plus
all-gather at the device's link rate. Latency terms add 2(k-1) intra-host and the inter-host
algorithm's hops. O(H k^2 + k * |inter schedule|) steps.

A phase's sends from a device start once everything the previous phase delivered to that device
has arrived: a zero-byte step from the device to itself joins them (`Step` with src == dst
carries no bytes and finishes when its deps do).

Pure functions over plain data, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from topoctl.sim.schedules import Schedule, Step, ring_steps

ShardAlgorithm = Callable[[int, Sequence[str], float], Schedule]  # (shard i, members, bytes)


def device_node(host: str, index: int) -> str:
    """The simulator's node of `host`'s device `index` (``h0/g3``)."""
    return f"{host}/g{index}"


def hierarchical_bound(size: float, hosts: int, local: int, device_bw: float,
                       host_bw: float) -> float:
    """The hierarchical AllReduce's bandwidth bound in seconds (module docstring): `size`
    bytes over `hosts` hosts of `local` devices, `device_bw` bytes/s per device per direction
    inside the host, `host_bw` bytes/s of a host's NIC goodput together. O(1)."""
    intra = 2 * (local - 1) / local * size / device_bw if local > 1 and device_bw > 0 else 0.0
    inter = 2 * (hosts - 1) / hosts * size / host_bw if hosts > 1 and host_bw > 0 else 0.0
    return intra + inter


def _append(steps: list[Step], part: Sequence[Step], scale: float,
            join: dict[str, int]) -> dict[str, list[int]]:
    """Append `part` (indices relative to its own start, sizes times `scale`) to `steps`; a
    step from a device with a join step in `join` also waits for it. Returns, per device, the
    indices of the appended steps delivered to it."""
    base = len(steps)
    delivered: dict[str, list[int]] = {}
    for j, s in enumerate(part):
        deps = tuple(base + d for d in s.deps)
        if s.src in join:
            deps += (join[s.src],)
        steps.append(Step(s.src, s.dst, s.size * scale, deps))
        delivered.setdefault(s.dst, []).append(base + j)
    return delivered


def _joins(steps: list[Step], delivered: dict[str, list[int]]) -> dict[str, int]:
    """One zero-byte self-step per device waiting for what was `delivered` to it."""
    out = {}
    for dev, idx in sorted(delivered.items()):
        out[dev] = len(steps)
        steps.append(Step(dev, dev, 0.0, tuple(idx)))
    return out


def hierarchical_steps(groups: Sequence[Sequence[str]], inter: Sequence[Schedule],
                       size: float = 1.0) -> tuple[Step, ...]:
    """The steps of the hierarchical AllReduce of `size` bytes: `groups[j]` the devices of
    host j (each of the same k), `inter[i]` the inter-host AllReduce of shard i over
    ``[g[i] for g in groups]`` (built for size/k bytes; its own `scale` is applied). O(steps)."""
    k = len(groups[0])
    if any(len(g) != k for g in groups):
        raise ValueError("hierarchical AllReduce: every host needs the same device count")
    if len(inter) != k:
        raise ValueError(f"hierarchical AllReduce: {len(inter)} inter-host schedules for {k} "
                         "shards")
    steps: list[Step] = []
    delivered: dict[str, list[int]] = {}
    for g in groups:  # 1. reduce-scatter inside each host: k-1 rounds of S/k
        delivered |= _append(steps, ring_steps(tuple(g), k - 1), size, {})
    join = _joins(steps, delivered)
    delivered = {}
    for sched in inter:  # 2. each shard across the hosts
        got = _append(steps, sched.steps, sched.scale, join)
        for dev, idx in got.items():
            delivered.setdefault(dev, []).extend(idx)
    join = _joins(steps, delivered) if len(groups) > 1 else join
    for g in groups:  # 3. all-gather inside each host
        _append(steps, ring_steps(tuple(g), k - 1), size, join)
    return tuple(steps)


def hierarchical_allreduce(groups: Sequence[Sequence[str]], size: float,
                           shard: ShardAlgorithm, name: str = "hierarchical") -> Schedule:
    """The hierarchical AllReduce of `size` bytes: `groups` the devices per host (host order),
    `shard(i, members, bytes)` the inter-host AllReduce of shard i (a ring over the members in
    host order, or trees, whose partitions and chunks depend on the bytes: built at the real
    size). Cached per (groups, shard, size)."""
    key = tuple(tuple(g) for g in groups)
    steps = _steps(key, shard, float(size))
    return Schedule(name, tuple(d for g in key for d in g), steps)


@lru_cache(maxsize=64)
def _steps(groups: tuple[tuple[str, ...], ...], shard: ShardAlgorithm, size: float
           ) -> tuple[Step, ...]:
    k = len(groups[0])
    inter = [shard(i, [g[i] for g in groups], size / k) for i in range(k)]
    return hierarchical_steps(groups, inter, size)


def ring_shards(i: int, members: Sequence[str], size: float) -> Schedule:
    """Shard `i`'s inter-host AllReduce as a ring in host order (`ShardAlgorithm`)."""
    del i  # every shard's ring follows the host order
    n = len(members)
    return Schedule("ring-allreduce", tuple(members), ring_steps(tuple(members), 2 * (n - 1)),
                    float(size))


def hierarchical_allgather(groups: Sequence[Sequence[str]], size: float,
                           name: str = "hierarchical-allgather") -> Schedule:
    """All-gather of a `size`-byte result, each of the H*k devices contributing size/(H k),
    over hosts of k devices (`groups`, host order): device i of every host ring-all-gathers
    the pieces of local index i across the hosts (H pieces; one copy of each crosses the
    NICs), then every host all-gathers its devices' H-piece blocks inside (a ring of k over
    the intra-host link). NIC bytes per host: (H-1)/H * size, as a flat ring's; the intra
    phase moves (k-1)/k * size per device. O(H k (H + k)) steps."""
    key = tuple(tuple(g) for g in groups)
    return Schedule(name, tuple(d for g in key for d in g), _gather_steps(key), float(size))


@lru_cache(maxsize=32)
def _gather_steps(groups: tuple[tuple[str, ...], ...]) -> tuple[Step, ...]:
    k, h = len(groups[0]), len(groups)
    if any(len(g) != k for g in groups):
        raise ValueError("hierarchical all-gather: every host needs the same device count")
    steps: list[Step] = []
    delivered: dict[str, list[int]] = {}
    for i in range(k):  # across the hosts, shard by shard: H pieces of 1/(H k)
        ring = tuple(g[i] for g in groups)
        for dev, idx in _append(steps, ring_steps(ring, h - 1), 1.0 / k, {}).items():
            delivered.setdefault(dev, []).extend(idx)
    join = _joins(steps, delivered) if h > 1 else {}
    for g in groups:  # inside each host: k blocks of 1/k
        _append(steps, ring_steps(g, k - 1), 1.0, join)
    return tuple(steps)
