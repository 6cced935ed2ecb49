"""The fabric as plain data: hosts, switches, ports and full-duplex links with capacities.

`FabricGraph` is the one shape every planner algorithm, the simulator and the renderer read;
code here never cares how a cluster file spelled it. `Cluster.graph()` (`spec.cluster`)
resolves a cluster file's fabric (direct cables or switches, defaults filled in) into one; this
module imports nothing from the schema, so the schema can import it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Port:
    """One cabled NIC of a host: its speed in bit/s and, when known, its MAC."""

    host: str
    nic: str
    speed: int  # bit/s
    mac: str | None = None

    @property
    def ref(self) -> str:
        """The port as `host:nic`."""
        return f"{self.host}:{self.nic}"


@dataclass(frozen=True)
class FabricLink:
    """A full-duplex link; `capacity` is per direction. Host ends name their NIC (`a_nic`),
    switch ends have None. kind: `cable` (host-host), `access` (host-switch), `uplink`."""

    a: str
    b: str
    capacity: int  # bit/s, each direction
    latency: float = 0.0  # seconds, one way
    loss: float = 0.0
    a_nic: str | None = None
    b_nic: str | None = None
    kind: Literal["cable", "access", "uplink"] = "cable"


@dataclass(frozen=True)
class FabricGraph:
    """Nodes are host and switch names (disjoint); links are full duplex. Parallel links between
    the same two nodes are kept (merge them yourself if you want one arc)."""

    kind: Literal["direct", "switched"]
    hosts: tuple[str, ...]
    switches: tuple[str, ...] = ()
    ports: tuple[Port, ...] = ()
    links: tuple[FabricLink, ...] = ()
    mtu: int = 1500
    _adj: dict = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        """The fabric as plain JSON-ready data."""
        d = asdict(self)
        d.pop("_adj")
        return d

    def neighbours(self, node: str) -> list[tuple[str, FabricLink]]:
        """(neighbour, link) for every link at `node` (adjacency built on first use)."""
        if not self._adj:
            for ln in self.links:
                self._adj.setdefault(ln.a, []).append((ln.b, ln))
                self._adj.setdefault(ln.b, []).append((ln.a, ln))
        return list(self._adj.get(node, []))

    def is_connected(self) -> bool:
        """True if every host reaches every other host."""
        if not self.hosts:
            return True
        seen, todo = {self.hosts[0]}, [self.hosts[0]]
        while todo:
            for nb, _ in self.neighbours(todo.pop()):
                if nb not in seen:
                    seen.add(nb)
                    todo.append(nb)
        return all(h in seen for h in self.hosts)


def lead_cable(links: Sequence[FabricLink]) -> FabricLink:
    """Of parallel links between the same two nodes, the one a pair's traffic takes: the
    fastest, the first of equals. One TCP connection (gloo keeps one per peer) cannot be spread
    over several cables, and a multipath route leaves the choice to the kernel's hash, which
    put it on the slow one in some runs (hetero8's h2-h3 bundle of 200 + 50 Mbit/s: trees
    1.44-1.83 s per iteration instead of 1.0 s). Routes, the simulator and the tree planner
    all use this cable; the others of the bundle carry no training traffic."""
    return max(links, key=lambda ln: ln.capacity)  # max keeps the first of equals


def connection_links(graph: FabricGraph) -> list[FabricLink]:
    """`graph.links` with every bundle of parallel links reduced to its `lead_cable`, in the
    order of the links. O(links)."""
    bundles: dict[tuple[str, str], list[FabricLink]] = {}
    for ln in graph.links:
        bundles.setdefault((min(ln.a, ln.b), max(ln.a, ln.b)), []).append(ln)
    leads = {id(lead_cable(b)) for b in bundles.values()}
    return [ln for ln in graph.links if id(ln) in leads]
