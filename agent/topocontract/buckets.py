"""Plan-named gradient buckets: the plan's ``job.collective.bucket_plan``, written by the
planner (`topoctl.strategies.disco`) and executed by the runtime (`topotrain.buckets`)::

    collective:
      algorithm: ring            # or trees (then `schedule`, as for DDP's buckets)
      bucket_plan:
        - {params: [net.6.bias, net.6.weight], bytes: 41000}
        - {params: [net.4.bias, net.4.weight, net.2.bias], bytes: 4198400}
        - ...

Each bucket names parameters (qualified names, as ``model.named_parameters()`` gives them);
together the buckets name every trainable parameter exactly once. The list order is the order
the buckets are all-reduced (the same on every rank): the runtime starts bucket k's AllReduce
as soon as its last gradient is ready and bucket k-1 has started. Any grouping and any sizes
are allowed: a plan groups parameters in gradient-ready order to overlap communication with
the backward pass, but the runtime is correct (only slower) for any grouping. ``bytes`` is
informational (the planner's size); the runtime uses the model's own tensors.

``bucket_overlap`` (a sibling of ``bucket_plan`` in the collective) says what the AllReduces
overlap with::

    collective:
      bucket_plan: [...]
      bucket_overlap: forward    # default: backward

- ``backward`` (the default, DDP's timeline): the iteration waits for every bucket at the end
  of the backward pass, then the optimizer steps.
- ``forward`` (cross-iteration overlap, as ByteScheduler and PACE schedule it): the iteration
  does not wait; in the next forward pass each module first waits for the bucket(s) holding
  its parameters and applies the optimizer to exactly those, so the AllReduces of the first
  layers' buckets run under the next forward. The result equals synchronous training. The
  list order still is the AllReduce order: a plan for this mode may list the buckets the
  forward needs first (the first layers') before others that were ready earlier; the runtime
  then holds the earlier ones back, which is how the plan gives the first layers priority.

Import-light: no torch, nothing of the controller or the runtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["BUCKET_OVERLAP_KEY", "BUCKET_PLAN_KEY", "OVERLAPS", "BucketPlanError",
           "bucket_overlap_of", "bucket_plan_of", "coverage_problems", "overlap_problems",
           "shape_problems"]

BUCKET_PLAN_KEY = "bucket_plan"
BUCKET_OVERLAP_KEY = "bucket_overlap"
OVERLAPS = ("backward", "forward")  # the first is the default
_BUCKET_KEYS = {"params", "bytes"}


class BucketPlanError(ValueError):
    """A bucket plan that cannot run: `problems` lists (YAML path, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems))


def shape_problems(plan: Any, at: str = "job.collective.bucket_plan") -> list[tuple[str, str]]:
    """Every problem (YAML path, message) of a bucket plan's shape: a non-empty list of
    mappings ``{params: [names], bytes: n}``, no parameter named twice. Empty when valid."""
    if not isinstance(plan, list) or not plan:
        return [(at, "expected a non-empty list of buckets ({params: [...]})")]
    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for i, b in enumerate(plan):
        here = f"{at}[{i}]"
        if not isinstance(b, dict):
            out.append((here, "expected a mapping {params: [parameter names], bytes: n}"))
            continue
        out += [(f"{here}.{k}", "unknown key (params, bytes)")
                for k in sorted(set(b) - _BUCKET_KEYS, key=str)]
        nbytes = b.get("bytes")
        if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int)
                                   or nbytes < 0):
            out.append((f"{here}.bytes", f"expected a byte count >= 0, not {nbytes!r}"))
        params = b.get("params")
        if not isinstance(params, list) or not params:
            out.append((f"{here}.params", "expected a non-empty list of parameter names"))
            continue
        for j, name in enumerate(params):
            if not isinstance(name, str) or not name:
                out.append((f"{here}.params[{j}]", f"expected a parameter name, not {name!r}"))
            elif name in seen:
                out.append((f"{here}.params[{j}]", f"{name} is already in {seen[name]}"))
            else:
                seen[name] = here
    return out


def overlap_problems(collective: dict, at: str = "job.collective") -> list[tuple[str, str]]:
    """Problems (YAML path, message) of a collective's ``bucket_overlap``: one of `OVERLAPS`,
    and only next to a ``bucket_plan``. Empty when valid or absent. O(1)."""
    if BUCKET_OVERLAP_KEY not in collective:
        return []
    value, here = collective[BUCKET_OVERLAP_KEY], f"{at}.{BUCKET_OVERLAP_KEY}"
    if value not in OVERLAPS:
        return [(here, f"expected one of {', '.join(OVERLAPS)}, not {value!r}")]
    if BUCKET_PLAN_KEY not in collective:
        return [(here, f"needs a {BUCKET_PLAN_KEY}: the plan's own buckets overlap this way")]
    return []


def bucket_overlap_of(collective: dict, at: str = "job.collective") -> str:
    """The collective's ``bucket_overlap`` (default ``backward``); BucketPlanError (YAML path)
    when it is not valid (`overlap_problems`)."""
    problems = overlap_problems(collective, at)
    if problems:
        raise BucketPlanError(problems)
    return collective.get(BUCKET_OVERLAP_KEY, OVERLAPS[0])


def coverage_problems(plan: list[dict], params: Iterable[str],
                      at: str = "job.collective.bucket_plan") -> list[tuple[str, str]]:
    """Problems of a well-shaped plan (`shape_problems` empty) against the model's trainable
    parameters `params`: a name the model does not have, a parameter no bucket names."""
    names = list(params)
    known = set(names)
    out = [(f"{at}[{i}].params[{j}]", f"the model has no trainable parameter {n}")
           for i, b in enumerate(plan) for j, n in enumerate(b["params"]) if n not in known]
    named = {n for b in plan for n in b["params"]}
    missing = [n for n in names if n not in named]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5
                                          else "")
        out.append((at, f"no bucket names the parameters {shown}"))
    return out


def bucket_plan_of(collective: dict, params: Iterable[str] | None = None,
                   at: str = "job.collective.bucket_plan") -> list[list[str]] | None:
    """The parameter names of each bucket, in AllReduce order, of a plan's `collective`; None
    when it names no buckets (DDP's own buckets). BucketPlanError (YAML paths) when the plan
    is malformed or, given the model's trainable `params`, does not cover them exactly."""
    plan = collective.get(BUCKET_PLAN_KEY)
    if plan is None:
        return None
    problems = shape_problems(plan, at)
    if not problems and params is not None:
        problems = coverage_problems(plan, params, at)
    if problems:
        raise BucketPlanError(problems)
    return [list(b["params"]) for b in plan]
