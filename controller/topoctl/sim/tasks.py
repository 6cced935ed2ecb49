"""What a strategy hands the simulator: a DAG of tasks, each naming the tasks it waits for."""

from __future__ import annotations

from dataclasses import dataclass

from topoctl.sim.schedules import Schedule


@dataclass(frozen=True)
class Compute:
    """`device` is busy for `duration` seconds. A device runs one task at a time; among ready
    tasks it runs the one listed first (the strategy's priority order). `communication`: the
    time is a collective runtime's own (the tree runtime's CPU part on its pseudo-device), not
    the model's compute, so it does not count in ``SimResult.compute_time``."""

    id: str
    device: str
    duration: float
    deps: tuple[str, ...] = ()
    communication: bool = False


@dataclass(frozen=True)
class Transfer:
    """`size` bytes from node `src` to node `dst` over the network's routes; done when the
    last byte is delivered (the receiver has the message).

    `buffer`: bytes the sender's kernel takes off its hands (a TCP socket's send buffer).
    The transfer then has a sender's part too, task :func:`sent` of its id, done as soon as
    at most `buffer` bytes are still to leave the sender (at once for a message that fits):
    a blocking socket send returns when the kernel holds the rest, not when the receiver has
    it (gloo's ``send`` after the receiver posted its receive, `topoctl.pipeline.gpipe`).
    None: no sender's part."""

    id: str
    src: str
    dst: str
    size: float
    deps: tuple[str, ...] = ()
    buffer: float | None = None


def sent(transfer_id: str) -> str:
    """Id of the sender's part of transfer `transfer_id` (one with a ``buffer``): done when
    the sender has handed the bytes to its kernel (`Transfer`)."""
    return f"{transfer_id}@sent"


@dataclass(frozen=True)
class Collective:
    """A collective schedule; its first steps wait for `deps`, it completes when all steps are
    delivered. With `member_done`, each member's own part is a task too (:func:`member_done`
    names it): done when every step the member sends or receives is delivered. A rank leaves
    a collective when its part is done, not when the last member's is (a tree's root and
    shallow members leave its broadcast steps before the deepest leaves do). On a network
    whose CPU pool prices messages (`network.CpuPool.messages`), every step between two pooled
    devices also costs its sender's and receiver's CPU (`engine`), unless `own_cpu`.
    `group`: the process group it runs in; collectives of one group share one connection per
    (src, dst) pair and are served there in the order they were issued (`sim.connections`),
    as a gloo process group's collectives share its one pair per peer. None: a connection
    of its own per pair."""

    id: str
    schedule: Schedule
    deps: tuple[str, ...] = ()
    member_done: bool = False
    # the strategy charges this collective runtime's CPU with tasks of its own (the tree
    # runtime's model, `collective.trees.pipeline`): the engine does not charge its messages
    # (`CpuPool.messages`)
    own_cpu: bool = False
    group: str | None = None


def member_done(collective_id: str, member: str) -> str:
    """Id of `member`'s part of collective `collective_id` (one with ``member_done=True``)."""
    return f"{collective_id}@{member}"


PREVIOUS = "prev:"  # prefix of a dependency on a task of the previous iteration


def previous(task_id: str) -> str:
    """A dependency on task `task_id` of the previous iteration (cross-iteration overlap: the
    next forward of a layer waits for the previous iteration's AllReduce of its gradients).
    `engine.simulate` runs one iteration from idle and ignores it; `steady.chain_iterations`
    makes copy i of the task wait for copy i-1 of `task_id`."""
    return PREVIOUS + task_id


def has_previous(tasks: list) -> bool:
    """Whether any task waits for one of the previous iteration (`previous`). O(deps)."""
    return any(d.startswith(PREVIOUS) for t in tasks for d in t.deps)


Task = Compute | Transfer | Collective
