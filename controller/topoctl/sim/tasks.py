"""What a strategy hands the simulator: a DAG of tasks, each naming the tasks it waits for."""

from __future__ import annotations

from dataclasses import dataclass

from topoctl.sim.schedules import Schedule


@dataclass(frozen=True)
class Compute:
    """`device` is busy for `duration` seconds. A device runs one task at a time; among ready
    tasks it runs the one listed first (the strategy's priority order)."""

    id: str
    device: str
    duration: float
    deps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Transfer:
    """`size` bytes from node `src` to node `dst` over the network's routes."""

    id: str
    src: str
    dst: str
    size: float
    deps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Collective:
    """A collective schedule; its first steps wait for `deps`, it completes when all steps are
    delivered."""

    id: str
    schedule: Schedule
    deps: tuple[str, ...] = ()


Task = Compute | Transfer | Collective
