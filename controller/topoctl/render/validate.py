"""Plan validation without the planner: what `topoctl apply/status/run` check before touching
any host, kept apart from the renderer (topoctl.render.plan) that makes plans.
The checks themselves are the agent's (`topoagent.state.wire.plan_problems`): one schema, two
users; a pipeline's per-stage gradient sync is the planner-runtime contract's
(`topocontract.stages.sync_problems`)."""

from __future__ import annotations

from typing import Any

from topoagent.state.wire import plan_problems
from topocontract.stages import sync_problems


def validate_plan(doc: Any) -> list[tuple[str, str]]:
    """Problems (yaml path, message) of a Plan document: its shape, every host's state against
    the agent's HostState schema, its job against the LaunchSpec and a pipeline's stage sync.
    Empty when valid."""
    problems = plan_problems(doc)
    job = doc.get("job") if isinstance(doc, dict) else None
    if isinstance(job, dict):
        problems += sync_problems(job.get("collective"))
    return problems
