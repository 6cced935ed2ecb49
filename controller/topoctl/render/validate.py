"""Plan validation without the planner: what `topoctl apply/status/run` check before touching
any host, kept apart from the renderer (topoctl.render.plan) that makes plans.
The checks themselves are the agent's (`topoagent.state.wire.plan_problems`): one schema, two
users."""

from __future__ import annotations

from typing import Any

from topoagent.state.wire import plan_problems


def validate_plan(doc: Any) -> list[tuple[str, str]]:
    """Problems (yaml path, message) of a Plan document: its shape, every host's state against
    the agent's HostState schema and its job against the LaunchSpec. Empty when valid."""
    return plan_problems(doc)
