"""The tree schedule file: written by the planner (``topoctl trees``/plans), read by training.

YAML or JSON::

    apiVersion: topoctl/v1
    kind: TreeSchedule
    world_size: 8              # ranks 0..world_size-1
    chunk_bytes: 262144        # pipelining chunk (a tree may override it)
    trees:
      - root: 3
        rate: 7.0              # any unit; partition fraction = rate / sum(rates)
        parents: [3, 3, 3, null, 3, 3, 3, 3]   # parent rank of every rank, null at the root
    metadata: {}               # free-form (planner, optimum, bound, units, ...)

Each tree reduces its partition toward ``root`` and broadcasts it back down (child->parent,
then parent->child, pipelined in chunks); all trees run at once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from topoagent.protocol import API_VERSION, TopoError

__all__ = [
    "ScheduleError",
    "ScheduleMismatch",
    "Tree",
    "TreeSchedule",
    "check_world_size",
    "load_schedule",
    "partition_sizes",
]


class ScheduleError(TopoError, ValueError):
    """The schedule file is malformed."""


class ScheduleMismatch(TopoError, RuntimeError):
    """The schedule does not fit the running job (world size)."""


class Tree(BaseModel):
    """One spanning tree over ranks: its root, its rate and each rank's parent (None at the
    root)."""

    model_config = ConfigDict(extra="forbid")

    root: int = Field(ge=0)
    rate: float = Field(gt=0)
    parents: list[int | None]
    chunk_bytes: int | None = Field(default=None, gt=0)

    @field_validator("rate")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("rate must be finite")
        return v

    def children(self, rank: int) -> list[int]:
        """The ranks whose parent is `rank`."""
        return [c for c, p in enumerate(self.parents) if p == rank]

    def height(self) -> int:
        """Edges on the longest path from a rank to the root."""
        depth = 0
        for r in range(len(self.parents)):
            d, cur = 0, r
            while self.parents[cur] is not None:
                cur = self.parents[cur]
                d += 1
            depth = max(depth, d)
        return depth


class TreeSchedule(BaseModel):
    """The tree schedule file: world size, chunk size and the trees with their rates."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal[API_VERSION] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["TreeSchedule"] = "TreeSchedule"
    world_size: int = Field(ge=1)
    chunk_bytes: int = Field(default=262144, gt=0)
    trees: list[Tree] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _trees_span(self) -> TreeSchedule:
        n = self.world_size
        for i, t in enumerate(self.trees):
            where = f"trees[{i}]"
            if len(t.parents) != n:
                raise ValueError(
                    f"{where}.parents has {len(t.parents)} entries, world_size is {n}"
                )
            if t.root >= n:
                raise ValueError(f"{where}.root {t.root} is not a rank < {n}")
            if t.parents[t.root] is not None:
                raise ValueError(f"{where}.parents[{t.root}] must be null (it is the root)")
            for r, p in enumerate(t.parents):
                if r == t.root:
                    continue
                if p is None:
                    raise ValueError(f"{where}.parents[{r}] is null but {r} is not the root")
                if not 0 <= p < n or p == r:
                    raise ValueError(f"{where}.parents[{r}] = {p} is not another rank < {n}")
            for r in range(n):  # every rank reaches the root: a spanning tree
                cur, steps = r, 0
                while t.parents[cur] is not None:
                    cur = t.parents[cur]
                    steps += 1
                    if steps > n:
                        raise ValueError(f"{where}.parents has a cycle through rank {r}")
        return self

    @property
    def fractions(self) -> list[float]:
        """Each tree's share of the data (rate over total rate)."""
        total = sum(t.rate for t in self.trees)
        return [t.rate / total for t in self.trees]

    def dump(self) -> dict[str, Any]:
        """The schedule as file data (aliases, no unset values)."""
        return self.model_dump(by_alias=True, exclude_none=True)


def load_schedule(source: str | Path | dict[str, Any]) -> TreeSchedule:
    """Read and validate a schedule from a path (YAML or JSON) or a dict."""
    if isinstance(source, dict):
        data, name = source, "<dict>"
    else:
        path = Path(source)
        name = str(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ScheduleError(f"{name}: cannot read schedule: {exc}") from exc
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ScheduleError(f"{name}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ScheduleError(f"{name}: expected a mapping at the top level")
    try:
        return TreeSchedule.model_validate(data)
    except ValueError as exc:
        raise ScheduleError(f"{name}: invalid tree schedule: {exc}") from exc


def check_world_size(schedule: TreeSchedule, world_size: int) -> None:
    """Refuse a schedule made for another world size, saying why."""
    if schedule.world_size != world_size:
        raise ScheduleMismatch(
            f"tree schedule is for world_size={schedule.world_size} but this job runs "
            f"{world_size} ranks; regenerate it for this job (topoctl trees / topoctl plan) "
            "or launch with the plan's ranks"
        )


def partition_sizes(numel: int, fractions: list[float]) -> list[int]:
    """Split ``numel`` elements in proportion to ``fractions`` (largest remainder; the same on
    every rank). Sizes may be 0 for tiny tensors."""
    raw = [numel * f for f in fractions]
    sizes = [int(math.floor(x)) for x in raw]
    rest = numel - sum(sizes)
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - sizes[i]), i))
    for i in order[:rest]:
        sizes[i] += 1
    return sizes
