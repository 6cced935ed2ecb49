"""The network as the simulator sees it: directed links and routes, as plain data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from topoagent.protocol import TopoError

Path = tuple[str, ...]  # link ids, in order
Routes = list[tuple[float, Path]]  # weighted paths (weights need not sum to 1)


@dataclass(frozen=True)
class Link:
    """One direction of a cable or switch port: capacity in bytes/s, latency in seconds.

    `credit`: bytes of token credit (a token-bucket shaper's burst, as the lab shapes its
    cables with HTB, ``topoctl.lab.commands.cable_credit``; 0 for a real link). The bucket
    fills with the capacity the link's flows leave unused, up to `credit`, and a
    point-to-point transfer that starts on the link passes what the bucket holds at once
    (`topoctl.sim.engine`)."""

    id: str
    src: str
    dst: str
    capacity: float
    latency: float = 0.0
    credit: float = 0.0


@dataclass(frozen=True)
class MessageCost:
    """The CPU a collective runtime spends on each point-to-point message at each of its two
    ends, besides the bytes on the wire: `per_message_s` seconds plus one second per
    `bytes_per_s` bytes (gloo's send or receive of one tensor: the machine's calibration,
    `topoctl.placement.runtime.message_cpu`, with the lab's cable emulation per byte)."""

    per_message_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        """CPU seconds one end spends on a message of `nbytes`."""
        return self.per_message_s + nbytes / self.bytes_per_s


class CpuPool(NamedTuple):
    """Devices whose work shares one machine's `cores` (the lab's single-threaded ranks):
    their compute tasks are processor-shared (`Network.cpu_pool`). `messages`: what each
    message of a collective between two of them costs its ends' CPU (None: nothing), drawn
    from the same cores on a communication thread per device (`topoctl.sim.engine`).

    `crowding`: the extra CPU a model compute task costs per unit of oversubscription while
    more of the pool's CPU flows run than it has cores (`crowded_cost`: time-slicing, each
    task's caches refilled after the others ran); 0: a CPU-second of work is one whatever
    runs beside it (compute timed beside co-running copies already carries it). Calibrated
    by timing a stage alone and beside copies (`topoctl.pipeline.gpipe`).

    `hosts`: (host, cores, ranks) for hosts of several pooled devices (``h0/g1``,
    `topoctl.sim.devices`) that share one CPU quota, as the lab's `ranks` of one host share
    its group's (`topoctl.lab.cpu.quotas`): their compute and message CPU together get at
    most `cores` (a pseudo link ``("quota", host)``), each device at most one core or the
    quota, whichever is less, so a rank whose host-mates idle uses their share. A compute
    task on the host node itself (pooled too: a data-parallel strategy's one task for all its
    ranks computing the same batch at once) costs `ranks` times its CPU-seconds, at most one
    core a rank. Empty: every pooled device is capped on its own (its `Network.speed`), as
    for one rank per host."""

    devices: frozenset[str]
    cores: int
    messages: MessageCost | None = None
    crowding: float = 0.0
    hosts: tuple[tuple[str, float, int], ...] = ()


def crowded_cost(crowding: float, runnable: int, cores: int) -> float:
    """CPU-seconds one CPU-second of model compute (timed alone) takes while `runnable` CPU
    flows share `cores` cores: ``1 + crowding * max(0, runnable / cores - 1)``, linear in the
    oversubscription (measured on the 2-core Xeon VM, a pipeline stage of the lab MLP beside
    1, 3 and 5 co-running copies: +0%, +10%, +19% of CPU time: docs/results.md). O(1)."""
    return 1.0 + max(0.0, crowding) * max(0.0, runnable / max(1, cores) - 1.0)


def as_cpu_pool(pool: CpuPool | tuple | None) -> CpuPool | None:
    """`pool` as a `CpuPool`: a plain (devices, cores[, messages, ...]) tuple gets the
    defaults of the fields it leaves out; None stays None. O(1)."""
    if pool is None or isinstance(pool, CpuPool):
        return pool
    return CpuPool(frozenset(pool[0]), *pool[1:])


def pool_host_quotas(pool: CpuPool | tuple | None) -> dict[str, tuple[float, int]]:
    """host -> (its CPU quota in cores, its ranks) for the hosts whose pooled devices share
    one (`CpuPool.hosts`); {} without a pool or without any."""
    pool = as_cpu_pool(pool)
    return {} if pool is None else {h: (float(q), int(k)) for h, q, k in pool.hosts}


class NoRoute(TopoError, LookupError):
    """No path between two endpoints of the simulated network."""


@dataclass
class Network:
    """`router(src, dst)` returns weighted paths (lists of link ids); results are cached.

    `rate_caps[(src, dst)]` caps the aggregate rate of all traffic from src to dst (bytes/s):
    a per-destination QoS class ceiling on the source host. `cpu_pool`: devices whose compute
    shares a machine's cores (see the field). `speed`: per-device compute rate (see the
    field)."""

    links: dict[str, Link]
    router: Callable[[str, str], Routes]
    rate_caps: dict[tuple[str, str], float] = field(default_factory=dict)
    # `CpuPool` (a plain (devices, cores[, ...]) tuple is made one): these devices' compute
    # tasks share `cores` cores (processor sharing, at most one core per task), e.g. the
    # lab's single-threaded ranks on one machine; with `messages`, so does their
    # collectives' per-message CPU
    cpu_pool: CpuPool | None = None
    # device -> its compute rate (a host's `speed`): a compute task of d seconds (timed at
    # speed 1) takes d / speed; on a CPU pool, the device's compute flows at most `speed`
    # cores (the lab host's CPU quota) instead of one. Devices not listed: 1
    speed: dict[str, float] = field(default_factory=dict)
    _cache: dict[tuple[str, str], Routes] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.cpu_pool = as_cpu_pool(self.cpu_pool)

    def routes(self, src: str, dst: str) -> Routes:
        """The weighted paths from `src` to `dst` (cached)."""
        key = (src, dst)
        r = self._cache.get(key)
        if r is None:
            if src == dst:
                r = [(1.0, ())]
            else:
                r = self.router(src, dst)
                if not r:
                    raise NoRoute(f"no route from {src} to {dst}")
            self._cache[key] = r
        return r

    def latency(self, path: Path) -> float:
        """Sum of the links' latencies along `path`."""
        return sum(self.links[ln].latency for ln in path)


def static_router(paths: dict[tuple[str, str], Routes]) -> Callable[[str, str], Routes]:
    """A router over an explicit table."""

    def route(src: str, dst: str) -> Routes:
        return paths.get((src, dst), [])

    return route


def star(hosts: list[str], capacity: float, latency: float = 0.0) -> Network:
    """Hosts on one non-blocking switch `sw`: the idealised full-bisection fabric (each host
    has one uplink and one downlink of `capacity`)."""
    links = {}
    for h in hosts:
        links[f"{h}>sw"] = Link(f"{h}>sw", h, "sw", capacity, latency / 2)
        links[f"sw>{h}"] = Link(f"sw>{h}", "sw", h, capacity, latency / 2)

    def route(src: str, dst: str) -> Routes:
        return [(1.0, (f"{src}>sw", f"sw>{dst}"))]

    return Network(links, route)
