"""Sliced, priority-scheduled gradient buckets: the plan's ``job.collective.bucket_slicing``,
a sibling of ``bucket_plan`` (`topocontract.buckets`), written by the planner
(`topoctl.strategies.disco`) and executed by the runtime (`topotrain.priority`)::

    collective:
      algorithm: ring
      bucket_plan: [{params: [...], bytes: 4198400}, ...]
      bucket_slicing:
        slice_bytes: 4000000        # every bucket cut into slices of this many bytes (the last
                                    # one smaller), or instead, per bucket of bucket_plan:
        # slices: [[2099200, 2099200], [41000], ...]   its slices' bytes, in order
        priority: [2, 1, 0]         # bucket_plan indices, highest priority first (default:
                                    # the list order)
        credit: 16000000            # bytes of slices in flight at most

Tensor partitioning and priority scheduling as ByteScheduler does them (Peng et al., "A
Generic Communication Scheduler for Distributed DNN Training Acceleration", SOSP'19): a
bucket's flat gradient buffer is cut into slices; each slice is all-reduced on its own; among
the slices ready on every rank, the one of the highest-priority bucket goes first (a slice
readied later overtakes queued ones of lower priority), as long as the slices in flight hold
at most ``credit`` bytes (one slice is always allowed, however large). A plan without
``bucket_slicing`` is run as before (`topocontract.buckets`).

Slices are byte ranges of the bucket's flat buffer: explicit sizes must sum to the bucket's
bytes and be whole elements (checked by the runtime against the model, `slice_counts`).

Import-light: no torch, nothing of the controller or the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topocontract.buckets import BUCKET_PLAN_KEY, BucketPlanError

__all__ = ["BUCKET_SLICING_KEY", "Slicing", "slice_counts", "slicing_of", "slicing_problems"]

BUCKET_SLICING_KEY = "bucket_slicing"
_KEYS = ("slice_bytes", "slices", "priority", "credit")


@dataclass(frozen=True)
class Slicing:
    """A validated ``bucket_slicing``: `slice_bytes` or per-bucket `slices` (exactly one set),
    `priority` (bucket indices, highest first: a permutation) and `credit` (bytes)."""

    priority: tuple[int, ...]
    credit: int
    slice_bytes: int | None = None
    slices: tuple[tuple[int, ...], ...] | None = None

    def rank(self) -> dict[int, int]:
        """Bucket index -> its place in the priority order (0 = highest)."""
        return {k: i for i, k in enumerate(self.priority)}

    def to_dict(self) -> dict[str, Any]:
        """The plan's plain data (``slice_bytes`` or ``slices``, ``priority``, ``credit``)."""
        out: dict[str, Any] = ({"slice_bytes": self.slice_bytes} if self.slices is None
                               else {"slices": [list(s) for s in self.slices]})
        return out | {"priority": list(self.priority), "credit": self.credit}


def _count(v: Any) -> bool:
    """A positive byte count (bool is not one)."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _slices_problems(slices: Any, plan: list, at: str) -> list[tuple[str, str]]:
    """Problems of explicit ``slices``: one non-empty list of positive byte counts per bucket,
    summing to the bucket's ``bytes`` where the plan states them."""
    if not isinstance(slices, list) or len(slices) != len(plan):
        return [(at, f"expected one list of slice sizes per bucket ({len(plan)} lists)")]
    out: list[tuple[str, str]] = []
    for i, s in enumerate(slices):
        if not isinstance(s, list) or not s or not all(_count(x) for x in s):
            out.append((f"{at}[{i}]", f"expected a non-empty list of byte counts > 0, not {s!r}"))
            continue
        stated = plan[i].get("bytes") if isinstance(plan[i], dict) else None
        if _count(stated) and sum(s) != stated:
            out.append((f"{at}[{i}]", f"the slices sum to {sum(s)} bytes, the bucket holds "
                                      f"{stated}"))
    return out


def _priority_problems(priority: Any, n: int, at: str) -> list[tuple[str, str]]:
    """Problems of ``priority``: every bucket index 0..n-1 exactly once."""
    if not isinstance(priority, list) or not all(
            isinstance(k, int) and not isinstance(k, bool) for k in priority):
        return [(at, f"expected a list of bucket indices, not {priority!r}")]
    if sorted(priority) != list(range(n)):
        return [(at, f"expected each bucket index 0..{n - 1} exactly once, not {priority}")]
    return []


def slicing_problems(collective: dict, at: str = "job.collective") -> list[tuple[str, str]]:
    """Every problem (YAML path, message) of a collective's ``bucket_slicing``: a mapping
    next to a well-formed ``bucket_plan`` with exactly one of ``slice_bytes``/``slices``, a
    ``priority`` permutation and a ``credit`` > 0. Empty when valid or absent. O(buckets +
    slices)."""
    if BUCKET_SLICING_KEY not in collective:
        return []
    s, here = collective[BUCKET_SLICING_KEY], f"{at}.{BUCKET_SLICING_KEY}"
    plan = collective.get(BUCKET_PLAN_KEY)
    if not isinstance(plan, list) or not plan:
        return [(here, f"needs a {BUCKET_PLAN_KEY}: the plan's own buckets are sliced")]
    if not isinstance(s, dict):
        return [(here, "expected a mapping {slice_bytes | slices, priority, credit}")]
    out = [(f"{here}.{k}", f"unknown key ({', '.join(_KEYS)})")
           for k in sorted(set(s) - set(_KEYS), key=str)]
    if ("slice_bytes" in s) == ("slices" in s):
        out.append((here, "expected exactly one of slice_bytes (one size for every bucket) "
                          "or slices (sizes per bucket)"))
    elif "slice_bytes" in s and not _count(s["slice_bytes"]):
        out.append((f"{here}.slice_bytes", f"expected a byte count > 0, not "
                                           f"{s['slice_bytes']!r}"))
    elif "slices" in s:
        out += _slices_problems(s["slices"], plan, f"{here}.slices")
    if "priority" in s:
        out += _priority_problems(s["priority"], len(plan), f"{here}.priority")
    if not _count(s.get("credit")):
        out.append((f"{here}.credit", f"expected the bytes in flight, a count > 0, not "
                                      f"{s.get('credit')!r}"))
    return out


def slicing_of(collective: dict, at: str = "job.collective") -> Slicing | None:
    """The collective's `Slicing`, None without ``bucket_slicing``; BucketPlanError (YAML
    paths) when it is not valid (`slicing_problems`)."""
    problems = slicing_problems(collective, at)
    if problems:
        raise BucketPlanError(problems)
    s = collective.get(BUCKET_SLICING_KEY)
    if s is None:
        return None
    n = len(collective[BUCKET_PLAN_KEY])
    slices = tuple(tuple(x) for x in s["slices"]) if "slices" in s else None
    return Slicing(tuple(s.get("priority", range(n))), s["credit"], s.get("slice_bytes"), slices)


def slice_counts(slicing: Slicing, k: int, numel: int, element: int,
                 at: str = "job.collective") -> list[int]:
    """Elements per slice of bucket `k` (`numel` elements of `element` bytes): `slice_bytes`
    rounded down to whole elements (at least one), the last slice the rest; or the explicit
    sizes, which must be whole elements summing to the bucket (BucketPlanError naming the
    YAML path otherwise). O(slices)."""
    if slicing.slices is None:
        step = max(1, slicing.slice_bytes // element)
        return [min(step, numel - a) for a in range(0, numel, step)] or [0]
    here = f"{at}.{BUCKET_SLICING_KEY}.slices[{k}]"
    sizes = slicing.slices[k]
    if any(b % element for b in sizes) or sum(sizes) != numel * element:
        raise BucketPlanError([(here, f"expected whole {element}-byte elements summing to the "
                                      f"bucket's {numel * element} bytes, not {list(sizes)}")])
    return [b // element for b in sizes]
