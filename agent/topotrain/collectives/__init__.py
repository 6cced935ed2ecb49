"""Runtime collectives used inside training processes: tree-schedule AllReduce and DDP hook.

Imports torch lazily so that the rest of the agent never needs it (the calibration is read
without torch; measuring it imports torch). The calibration functions are imported on first
use too: ``python -m topotrain.collectives.calibrate`` then runs a module the package has not
imported yet (otherwise runpy warns that it is already in ``sys.modules``).
"""

from __future__ import annotations

from topocontract.schedule import (
    ScheduleError,
    ScheduleMismatch,
    Tree,
    TreeSchedule,
    check_world_size,
    load_schedule,
    partition_sizes,
)

__all__ = [
    "ScheduleError",
    "ScheduleMismatch",
    "Tree",
    "TreeSchedule",
    "calibration_path",
    "check_world_size",
    "ensure_calibration",
    "load_calibration",
    "load_schedule",
    "partition_sizes",
    "register_hierarchy_hook",
    "register_tree_hook",
    "tree_allreduce",
]


_CALIBRATE = ("calibration_path", "ensure_calibration", "load_calibration")


def __getattr__(name: str):
    if name in _CALIBRATE:
        from . import calibrate  # no torch: the controller's fast paths read the calibration

        return getattr(calibrate, name)
    if name == "tree_allreduce":
        from .program import tree_allreduce  # torch: only when a rank runs AllReduce

        return tree_allreduce
    if name == "register_tree_hook":
        from .ddp_hook import register_tree_hook  # torch: as above

        return register_tree_hook
    if name == "register_hierarchy_hook":
        from .hierarchy import register_hierarchy_hook  # torch: as above

        return register_hierarchy_hook
    raise AttributeError(name)
