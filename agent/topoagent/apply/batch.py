"""Running operations many per send, with each acknowledgement matched to its operation.

Consecutive operations that are netlink requests (`Op.requests`) go to the kernel as one
batch (`topoagent.drivers.nlwrite.Channel.call`: one send per few thousand requests, one
acknowledgement each); any other operation (a sysctl, a link, OVS) runs alone, in its place,
so the dependency order of `topoagent.apply.kernel_ops.PHASES` is kept exactly.

What counts as done is what the kernel acknowledged: an operation is done when at least one of
its requests took effect (a composite one, the agent's HTB tree, half-built, is done: its
inverse deletes the whole tree), and refused when any was refused. The kernel handles the
requests of one send in order and an error does not stop the others, so an operation after a
refused one in the same send may be done: it is reported done, and the caller's revert undoes
it with the rest. With `stop`, no later send happens: those operations are known not done."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from topoagent.apply.kernel_ops import Driver, Op


@dataclass
class Failure:
    """An operation the kernel (or the driver) refused, and why."""

    op: Op
    reason: str


def reason_of(e: BaseException) -> str:
    """An exception as one line (a pyroute2 NetlinkError's (code, message): the message)."""
    args = getattr(e, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return f"{args[1]} (errno {args[0]})" if "errno" not in str(args[1]) else str(args[1])
    return str(e) or type(e).__name__


def execute(drv: Driver, ops: list[Op], done: list[Op], *, stop: bool = True,
            before: Callable[[list[Op]], None] | None = None,
            after: Callable[[int], None] | None = None) -> list[Failure]:
    """Run `ops` in order, appending each operation that took effect to `done`; returns the
    refusals (with `stop`: at most one, and nothing after it is sent). `before(run)` is called
    with each group of operations before any of them reaches the kernel (the journal),
    `after(k)` once `done` holds k operations, for every k (the crash points)."""
    failures: list[Failure] = []
    i = 0
    while i < len(ops) and not (stop and failures):
        run, reqs, refused = _build(drv, ops, i)
        if run:
            if before is not None:
                before(run)
            failures += _send(drv, run, reqs, done, stop, after)
            i += len(run)
        elif refused is not None:  # the requests could not even be built (no such link)
            failures.append(refused)
            i += 1
        else:
            op = ops[i]
            if before is not None:
                before([op])
            try:
                op.apply(drv)
            except Exception as e:  # the kernel (or the system) said no
                failures.append(Failure(op, reason_of(e)))
            else:
                _did(done, [op], after)
            i += 1
    return failures


def _build(drv: Driver, ops: list[Op], i: int) -> tuple[list[Op], list[list], Failure | None]:
    """The run of request operations starting at `i` and their requests; a refusal when the
    first one's requests cannot be built."""
    run: list[Op] = []
    reqs: list[list] = []
    for op in ops[i:]:
        try:
            r = op.requests(drv)
        except Exception as e:  # e.g. LookupError: no such link
            if not run:
                return [], [], Failure(op, reason_of(e))
            break  # sent first; this one is retried (and refused) as the next run's head
        if r is None:
            break
        run.append(op)
        reqs.append(r)
    return run, reqs, None


def _send(drv: Driver, run: list[Op], reqs: list[list], done: list[Op], stop: bool,
          after: Callable[[int], None] | None) -> list[Failure]:
    acks = drv.call([r for rs in reqs for r in rs], stop=stop)
    failures, took, k = [], [], 0
    for op, rs in zip(run, reqs, strict=True):
        mine = acks[k: k + len(rs)]
        k += len(rs)
        if any(a.ok or a.maybe for a in mine):
            took.append(op)
        bad = next((a for a in mine if not a.ok and a.error != -1), None)
        if bad is not None:
            failures.append(Failure(op, bad.reason()))
    _did(done, took, after)
    return failures


def _did(done: list[Op], ops: list[Op], after: Callable[[int], None] | None) -> None:
    """Record `ops` as done, all of them before the first crash point (so an exception at one
    still leaves `done` naming everything the kernel did)."""
    n = len(done)
    done.extend(ops)
    if after is not None:
        for k in range(n + 1, len(done) + 1):
            after(k)
