"""The placement problem as plain data, its objective and the schedule of a given assignment.

A problem: a DAG of n nodes (coarse-graph groups or single ops) in topological order, the
seconds node i takes on device d (`cost[i][d]`, forward + backward), the bytes it keeps on
its device (`memory[i]`), the bytes on every edge, and per device pair the bandwidth (bytes/s,
the bottleneck of the route between the two hosts) and latency of the fabric.

Objective (one iteration of `microbatches` micro-batches, GPipe/1F1B-style):
    makespan(one micro-batch) + (microbatches - 1) * max_d load(d)
i.e. the latency of the first micro-batch through the placed graph plus the bottleneck device's
share of every later one (Huang et al., GPipe, NeurIPS'19; Narayanan et al., PipeDream,
SOSP'19). With one micro-batch it is the thesis's makespan of the placed graph.

`evaluate` is the shared yardstick of every algorithm here: a list schedule of a fixed
assignment (nodes in a priority order consistent with the DAG, each appended to its device's
timeline at max(device free, inputs arrived)). Given the processing order, this semi-active
schedule is the earliest one with those per-device sequences, so minimising over every
topological order finds the optimum of an assignment (what the tests' brute force does).
O(n * D + E).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from topoagent.protocol import TopoError


class PlacementError(TopoError, ValueError):
    """The model cannot be placed on these devices (memory, device count, ...)."""


@dataclass(frozen=True)
class PlacementProblem:
    """A placement problem: nodes in topological order, devices, per-device costs, memory, edges and
    transfer times."""

    nodes: list[str]  # topological order
    devices: list[str]
    cost: list[list[float]]  # cost[i][d] seconds
    memory: list[float]  # bytes node i keeps on its device
    capacity: list[float]  # bytes per device
    edges: dict[tuple[int, int], float]  # (i, j) -> bytes, i < j
    bandwidth: list[list[float]]  # bytes/s from device d to device e (inf on the diagonal)
    latency: list[list[float]] = field(default_factory=list)  # seconds (empty: none)
    microbatches: int = 1

    def comm(self, nbytes: float, d: int, e: int) -> float:
        """Seconds to move `nbytes` from device d to device e."""
        if d == e or nbytes <= 0:
            return 0.0
        lat = self.latency[d][e] if self.latency else 0.0
        return nbytes / self.bandwidth[d][e] + lat

    def preds(self) -> list[list[int]]:
        """Per node, the nodes with an edge into it."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for i, j in self.edges:
            out[j].append(i)
        return out

    def succs(self) -> list[list[int]]:
        """Per node, the nodes it has an edge to."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for i, j in self.edges:
            out[i].append(j)
        return out

    def check(self) -> None:
        """Raise PlacementError on shape errors, backward edges or a node that fits nowhere."""
        n, dv = len(self.nodes), len(self.devices)
        if dv == 0:
            raise PlacementError("no devices to place on")
        if len(self.cost) != n or any(len(c) != dv for c in self.cost):
            raise PlacementError("cost must be n x devices")
        for i, j in self.edges:
            if not 0 <= i < j < n:
                raise PlacementError(f"edge {i}->{j} is not forward in the node order")
        big = max(self.capacity)
        for i, m in enumerate(self.memory):
            if m > big:
                raise PlacementError(f"{self.nodes[i]} needs {m / 1e9:.3g} GB, more than any "
                                     f"device has ({big / 1e9:.3g} GB)")
        if sum(self.memory) > sum(self.capacity):
            raise PlacementError(f"the model needs {sum(self.memory) / 1e9:.3g} GB, the "
                                 f"{dv} devices have {sum(self.capacity) / 1e9:.3g} GB together")


@dataclass(frozen=True)
class Placement:
    """An assignment (node index -> device index) and its schedule. `objective` is the problem's
    objective; `gap` the relative MIP gap when an exact solver stopped early (0 when proven
    optimal, None for heuristics); `info` what the algorithm reports (nodes explored, ...)."""

    assign: list[int]
    objective: float
    makespan: float
    bottleneck: float
    start: list[float]
    algorithm: str
    gap: float | None = None
    info: dict = field(default_factory=dict)

    def devices_used(self) -> list[int]:
        """The devices that run at least one node, sorted."""
        return sorted(set(self.assign))


def upward_rank(p: PlacementProblem) -> list[float]:
    """HEFT's upward rank with mean costs and mean communication (Topcuoglu et al.)."""
    dv = len(p.devices)
    succ = p.succs()
    mean_bw = [[p.comm(1.0, d, e) for e in range(dv)] for d in range(dv)]
    per_byte = (sum(sum(r) for r in mean_bw) / (dv * (dv - 1))) if dv > 1 else 0.0
    rank = [0.0] * len(p.nodes)
    for i in reversed(range(len(p.nodes))):
        rank[i] = sum(p.cost[i]) / dv + max(
            (rank[s] + p.edges[(i, s)] * per_byte for s in succ[i]), default=0.0)
    return rank


def priority_order(p: PlacementProblem) -> list[int]:
    """Nodes by decreasing upward rank (a topological order: a node outranks its successors
    when costs are positive; ties and zero costs are broken by the node order)."""
    rank = upward_rank(p)
    order = sorted(range(len(p.nodes)), key=lambda i: (-rank[i], i))
    # zero-cost nodes can tie with their successors: repair to a topological order
    pos = {i: k for k, i in enumerate(order)}
    preds = p.preds()
    done: set[int] = set()
    out: list[int] = []
    waiting = sorted(range(len(p.nodes)), key=pos.__getitem__)
    while waiting:
        for k, i in enumerate(waiting):
            if all(q in done for q in preds[i]):
                out.append(i)
                done.add(i)
                del waiting[k]
                break
    return out


def evaluate(p: PlacementProblem, assign: list[int], order: list[int] | None = None,
             algorithm: str = "given") -> Placement:
    """Schedule a fixed assignment (see module docstring); memory is not checked here."""
    n = len(p.nodes)
    order = priority_order(p) if order is None else order
    preds = p.preds()
    free = [0.0] * len(p.devices)
    load = [0.0] * len(p.devices)
    start = [0.0] * n
    finish = [0.0] * n
    for i in order:
        d = assign[i]
        ready = max((finish[q] + p.comm(p.edges[(q, i)], assign[q], d) for q in preds[i]),
                    default=0.0)
        start[i] = max(free[d], ready)
        finish[i] = start[i] + p.cost[i][d]
        free[d] = finish[i]
        load[d] += p.cost[i][d]
    makespan = max(finish, default=0.0)
    bottleneck = max(load, default=0.0)
    return Placement(list(assign), makespan + (p.microbatches - 1) * bottleneck, makespan,
                     bottleneck, start, algorithm)


def memory_ok(p: PlacementProblem, assign: list[int]) -> bool:
    """Whether `assign` keeps every device within its memory capacity."""
    used = [0.0] * len(p.devices)
    for i, d in enumerate(assign):
        used[d] += p.memory[i]
    return all(u <= c * (1 + 1e-9) for u, c in zip(used, p.capacity, strict=True))


def lower_bound(p: PlacementProblem) -> float:
    """max(critical path with every node on its fastest device and free communication,
    total fastest work / devices) for the first micro-batch, plus (microbatches - 1) times the
    balanced share of the total work: no placement beats it."""
    best = [min(c) for c in p.cost]
    succ = p.succs()
    path = [0.0] * len(p.nodes)
    for i in reversed(range(len(p.nodes))):
        path[i] = best[i] + max((path[s] for s in succ[i]), default=0.0)
    share = sum(best) / len(p.devices)
    return max(max(path, default=0.0), share) + (p.microbatches - 1) * share


def serial(p: PlacementProblem) -> Placement | None:
    """Everything on the fastest device that holds the whole model (None if none does)."""
    need = sum(p.memory)
    fits = [d for d in range(len(p.devices)) if p.capacity[d] >= need]
    if not fits:
        return None
    d = min(fits, key=lambda d: (sum(c[d] for c in p.cost), d))
    return evaluate(p, [d] * len(p.nodes), algorithm="serial")


INF = math.inf
