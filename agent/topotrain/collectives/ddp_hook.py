"""A DDP communication hook that averages gradient buckets with the plan's tree schedule.

    from topotrain.collectives import register_tree_hook
    model = DistributedDataParallel(net)
    register_tree_hook(model)            # schedule from $TOPO_TREE_SCHEDULE (the launch spec)
    register_tree_hook(model, "sched.yaml")

Buckets are reduced by one background thread per hook, in the order DDP hands them over (the
same on every rank), so communication overlaps the rest of the backward pass; the hook refuses
to start when the schedule's world size differs from the process group's. Every bucket's
timing is kept (`TreeHookState.take_timings`: bytes, seconds waiting for the thread, seconds
of the AllReduce) for the trainer to report with its iteration.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at runtime
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from topoagent.state.wire import TREE_SCHEDULE_ENV as ENV_SCHEDULE
from topocontract.schedule import ScheduleError, TreeSchedule, check_world_size, load_schedule
from topotrain.collectives.program import tree_allreduce

__all__ = ["ENV_SCHEDULE", "TreeHookState", "register_tree_hook", "tree_allreduce_hook"]


@dataclass
class TreeHookState:
    """The hook's state: the tree schedule, the process group and the one worker thread."""

    schedule: TreeSchedule
    group: dist.ProcessGroup | None = None
    # one thread: buckets are reduced one after another, in DDP's order, on every rank
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="tree-allreduce")
    )
    # per bucket reduced since the last `take_timings`: (bytes, seconds from DDP handing it
    # over to the thread starting it, seconds of the AllReduce), in the order reduced
    timings: list = field(default_factory=list)

    def take_timings(self) -> list[tuple[int, float, float]]:
        """The buckets' timings since the last call (DDP's backward has waited for every
        bucket of an iteration by the time it returns), and forget them."""
        out, self.timings = self.timings, []
        return out


def tree_allreduce_hook(
    state: TreeHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: average `bucket` over all ranks with the tree schedule; a future of the averaged
    buffer."""
    buf = bucket.buffer()
    fut: torch.futures.Future = torch.futures.Future()
    handed = time.perf_counter()

    def work() -> None:
        try:
            start = time.perf_counter()
            tree_allreduce(buf, state.schedule, state.group)
            state.timings.append((buf.numel() * buf.element_size(), start - handed,
                                  time.perf_counter() - start))
            buf.div_(state.schedule.world_size)
            fut.set_result(buf)
        except BaseException as exc:  # noqa: BLE001 - handed to DDP through the future
            fut.set_exception(exc)

    state.executor.submit(work)
    return fut


def register_tree_hook(
    model: torch.nn.parallel.DistributedDataParallel,
    schedule: TreeSchedule | str | Path | None = None,
    group: dist.ProcessGroup | None = None,
) -> TreeHookState:
    """Validate ``schedule`` against the running world size and register the hook."""
    if schedule is None:
        path = os.environ.get(ENV_SCHEDULE)
        if not path:
            raise ScheduleError(f"no tree schedule given and ${ENV_SCHEDULE} is not set")
        schedule = path
    if not isinstance(schedule, TreeSchedule):
        schedule = load_schedule(schedule)
    group = group if group is not None else getattr(model, "process_group", None)
    check_world_size(schedule, dist.get_world_size(group))
    state = TreeHookState(schedule, group)
    model.register_comm_hook(state, tree_allreduce_hook)
    return state
