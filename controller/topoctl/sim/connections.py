"""One connection per peer for the collectives of one process group, served in issue order.

A gloo process group opens one connection (a gloo "pair") per peer, and every collective of
the group sends its messages over it: ProcessGroupGloo's asynchronous AllReduces (DDP's
buckets, the bucket runtime's `async_op=True` ones) do not share the wire side by side, they
queue on it. In the lab a bucket's AllReduce ends after the one issued before it even when
it is far smaller (ResNet-18's last bucket of a few KB ended after a 1.2 MB one; on
loopback a 1 KB AllReduce issued right after a 4 MB one took 4.9 ms instead of 0.56 ms,
docs/results.md, "DisCo").

The engine (`sim.engine`) models this for `Collective`s that name a ``group``: each
(group, src, dst) is one FIFO server. A collective joins the queue of every connection it
uses when it is issued (its first step is ready), so the queues hold the collectives in issue
order; the collective at the head holds the connection from its first step there until its
last step there has left, its steps one at a time in the order they became ready; then the
next collective's steps go. A collective therefore cannot move bytes on a connection before
every collective of its group issued before it is done there, while it may already send on
connections the earlier ones have left (a ring over n > 2 members pipelines one bucket
behind the other). Collectives without a group keep a connection of their own per pair (the
engine's per-collective FIFO).

No deadlock: on every connection the queue order is the issue order, so the earliest issued
collective with steps left is at the head of each of its queues and waits only for its own
steps. Cost: O(connections of the collective) to issue, O(1) per step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

Pair = tuple[str, str]  # (src, dst) of a step
Key = tuple[str, str, str]  # (group, src, dst): one connection


def connection_steps(pairs: Iterable[Pair]) -> dict[Pair, int]:
    """How many steps of one collective use each connection: `pairs` are its steps' (src,
    dst), the result in first-use order. O(steps)."""
    out: dict[Pair, int] = {}
    for p in pairs:
        out[p] = out.get(p, 0) + 1
    return out


@dataclass
class Connection:
    """One (group, src, dst) connection: `queue` the collectives with steps left on it in issue
    order (the head holds it), `left` their steps still to send here, `waiting` their steps
    that are ready but not sent, `busy` whether a step is on the wire (or posting)."""

    queue: deque[int] = field(default_factory=deque)
    left: dict[int, int] = field(default_factory=dict)
    waiting: dict[int, deque[int]] = field(default_factory=dict)
    busy: bool = False


@dataclass
class GroupConnections:
    """The connections of every process group in one simulation (module docstring)."""

    conns: dict[Key, Connection] = field(default_factory=dict)
    issued: set[int] = field(default_factory=set)

    def issue(self, collective: int, group: str, counts: dict[Pair, int]) -> None:
        """Collective `collective` (any hashable id) of `group` is issued: it joins the queue of
        each connection it uses (`counts`: its steps per (src, dst), `connection_steps`).
        Issuing twice does nothing."""
        if collective in self.issued:
            return
        self.issued.add(collective)
        for (src, dst), n in counts.items():
            conn = self.conns.setdefault((group, src, dst), Connection())
            conn.queue.append(collective)
            conn.left[collective] = n
            conn.waiting[collective] = deque()

    def take(self, key: Key, collective: int, step: int) -> bool:
        """Whether `step` of `collective` (issued) may send on connection `key` now; if not, it
        waits there until `release` hands it out."""
        conn = self.conns[key]
        if not conn.busy and conn.queue[0] == collective:
            conn.busy = True
            return True
        conn.waiting[collective].append(step)
        return False

    def release(self, key: Key, collective: int) -> int | None:
        """A step of `collective` has left connection `key`: the step to send next on it (the
        next ready step of the collective holding it, which is the next in issue order once
        `collective` has no steps left here), or None when none is ready."""
        conn = self.conns[key]
        conn.busy = False
        conn.left[collective] -= 1
        if not conn.left[collective]:
            conn.queue.popleft()  # it was the head: only the head sends
            del conn.left[collective], conn.waiting[collective]
        if not conn.queue:
            del self.conns[key]
            return None
        ready = conn.waiting[conn.queue[0]]
        if not ready:
            return None
        conn.busy = True
        return ready.popleft()
