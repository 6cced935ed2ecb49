"""Search limits that keep plans deterministic: same cluster and job, same plan bytes.

Every search (tree packing, bounds, placement, TAG's tree and walk, and the strategies to
come) is bounded by counts by default: iterations, nodes, augmentations, playouts, simulations,
seeds run to completion, never by wall-clock seconds, so a loaded machine plans exactly what a
quiet one does. Wall clock appears only as an outer safety net (`SafetyClock`) against a
pathological input, or when the job itself asks for one (`tag.time_limit`,
`topoctl.tag.budget`): when it cuts a search short the search stops where it is and says so,
and the strategy reports it in the plan's metadata under `cut_short` (with a
`cut_short_note`; `topoctl explain` prints it), since that plan may then differ from run to
run. `tests/unit/test_plan_deterministic.py` looks for that key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

SAFETY_S = 300.0  # per strategy; a search this long is a bug or an absurd input

# The largest cluster `topoctl plan` takes on by default (`--max-hosts` raises it). The schema
# accepts up to 4,096 hosts, but the planner's searches grow faster than linearly: a 4,096-host
# ring ran > 60 s and > 5 GB. A larger cluster is refused up front, with this limit named,
# instead of hanging.
MAX_PLAN_HOSTS = 1024


@dataclass
class SafetyClock:
    """Wall-clock safety net shared by the steps of one search.

    `expired(step)` is True once `seconds` have passed since creation, and records `step` in
    `cut` (each step once). It never decides anything while it has not expired."""

    seconds: float = SAFETY_S
    start: float = field(default_factory=time.perf_counter)
    cut: list[str] = field(default_factory=list)

    def expired(self, step: str) -> bool:
        """Has the safety limit passed? If so, note that `step` was cut short."""
        if time.perf_counter() - self.start <= self.seconds:
            return False
        if step not in self.cut:
            self.cut.append(step)
        return True

    def left(self) -> float:
        """Seconds until the limit (>= 0): what an external solver may be given as its own
        time limit, alongside a deterministic node/iteration limit."""
        return max(0.0, self.seconds - (time.perf_counter() - self.start))

    def report(self) -> dict:
        """{"cut_short": [...]} when the limit cut in (for plan metadata), else {}."""
        if not self.cut:
            return {}
        return {"cut_short": list(self.cut),
                "cut_short_note": f"wall-clock safety limit ({self.seconds:g} s) reached: this "
                                  "plan may differ from run to run"}
