"""Plan validation without the planner: what `topoctl apply/status/run` check before touching
any host. Kept apart from topoctl.render.plan, whose catalog import pulls in torch (1.2 s)."""

from __future__ import annotations

from typing import Any

from topoagent.state import StateError, parse_host_state


def validate_plan(doc: Any) -> list[tuple[str, str]]:
    """Problems (yaml path, message) of a Plan document: its shape and every host's state
    against the agent's HostState schema. Empty when valid."""
    if not isinstance(doc, dict):
        return [("", "expected a mapping (a Plan)")]
    problems = []
    if doc.get("apiVersion") != "topoctl/v1" or doc.get("kind") != "Plan":
        problems.append(("kind", "expected apiVersion: topoctl/v1, kind: Plan"))
    for key in ("metadata", "fabric", "hosts", "job"):
        if not isinstance(doc.get(key), dict):
            problems.append((key, "missing (a mapping)"))
    extra = set(doc) - {"apiVersion", "kind", "metadata", "fabric", "hosts", "job"}
    problems += [(k, "unknown key") for k in sorted(extra)]
    for name, state in (doc.get("hosts") or {}).items():
        try:
            parse_host_state(state, prefix=f"hosts.{name}")
        except StateError as e:
            problems += e.problems
    procs = (doc.get("job") or {}).get("processes") or {}
    for name in procs:
        if name not in (doc.get("hosts") or {}):
            problems.append((f"job.processes.{name}", "no such host in hosts"))
    return problems
