"""Operator fusion as the plan names it and the training runtime does it (DisCo's operator
fusion half: Chen et al., "DisCo: distributed training with joint operator and tensor fusion",
TPDS; code TPDS-Submission/Disco and yxd886/fuse).

A plan's ``job.fusion`` is ``{"mode": "none" | "groups" | "whole", "regions": [module path,
...], "budget_s": seconds}``. A region is a module path as ``model.named_modules()`` gives it
(``""`` is the whole model, ``"layers.3"`` a ResNet block): the runtime compiles that module's
forward as one with torch.compile (inductor, CPU C++ kernels), so every op inside it belongs
to one fused program, forward and backward. Regions are modules, not arbitrary op sets, so that
the runtime can compile them in place: the parameters keep their names (gradient buckets name
parameters) and nothing of the model is rewritten. `region_of` says which region an op of the
captured graph falls in (its module scope under a region's path); the planner's cost side
(``topoctl.disco.fusion``) and the runtime (``topotrain.fusion``) both use it.

``budget_s``: seconds of compiling the runtime may spend; a region whose turn comes after the
budget is spent stays eager (a visible fallback, with the figures). Compiled code is cached by
inductor under `inductor_cache_dir` (project-prefixed), so a second run of the same plan
reuses it. Import-light: no torch, nothing of the controller or the runtime. All O(regions)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

MODES = ("none", "groups", "whole")
DEFAULT_BUDGET_S = 600.0  # a plan's default compile budget per rank
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # inductor's own variable: where its cache lives
OWN_CACHE_ENV = "TOPOCTL_INDUCTOR_CACHE"  # ours: overrides the default of `inductor_cache_dir`


@dataclass(frozen=True)
class FusionPlan:
    """The plan's fusion choice: `mode`, the regions compiled (module paths, in model order)
    and the compile budget in seconds."""

    mode: str = "none"
    regions: tuple[str, ...] = field(default_factory=tuple)
    budget_s: float = DEFAULT_BUDGET_S

    def to_dict(self) -> dict:
        """The plan's ``job.fusion`` (`parse_fusion` reads it back)."""
        return {"mode": self.mode, "regions": list(self.regions), "budget_s": self.budget_s}


def parse_fusion(doc: object, where: str = "job.fusion") -> FusionPlan:
    """The `FusionPlan` of a plan's ``job.fusion`` (empty or missing: no fusion); ValueError
    naming the YAML path when it is malformed. ``whole`` means the region ``""``."""
    if not doc:
        return FusionPlan()
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(doc).__name__}")
    unknown = sorted(set(doc) - {"mode", "regions", "budget_s"})
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key (known: mode, regions, budget_s)")
    mode = doc.get("mode", "none")
    if mode not in MODES:
        raise ValueError(f"{where}.mode: {mode!r} is not one of {', '.join(MODES)}")
    regions = doc.get("regions", [""] if mode == "whole" else [])
    if not isinstance(regions, list) or not all(isinstance(r, str) for r in regions):
        raise ValueError(f"{where}.regions: expected a list of module paths")
    problems = _region_problems(mode, regions)
    if problems:
        raise ValueError(f"{where}.regions: {problems}")
    budget = doc.get("budget_s", DEFAULT_BUDGET_S)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0:
        raise ValueError(f"{where}.budget_s: expected seconds >= 0, got {budget!r}")
    return FusionPlan(mode, tuple(regions), float(budget))


def _region_problems(mode: str, regions: list[str]) -> str:
    """Why `regions` do not fit `mode` ('' when they do): none has no regions, whole only the
    root, groups disjoint non-root paths (a region inside another would be compiled twice)."""
    if mode == "none" and regions:
        return "mode none compiles no region"
    if mode == "whole" and regions != [""]:
        return "mode whole compiles the root module only ([''])"
    if mode == "groups":
        if "" in regions or not regions:
            return "mode groups needs module paths other than the root"
        for a in regions:
            for b in regions:
                if a != b and inside(a, b):
                    return f"{a!r} lies inside {b!r}"
        if len(set(regions)) != len(regions):
            return "a region is named twice"
    return ""


def inside(scope: str, region: str) -> bool:
    """Whether module path `scope` is `region` or lies under it (``""`` holds everything)."""
    return region == "" or scope == region or scope.startswith(region + ".")


def region_of(scope: str, regions: tuple[str, ...] | list[str]) -> str | None:
    """The region an op whose innermost module is `scope` belongs to (the deepest region
    holding it), None when it is in none. O(regions)."""
    best = None
    for r in regions:
        if inside(scope, r) and (best is None or len(r) > len(best)):
            best = r
    return best


def inductor_cache_dir() -> str:
    """Where inductor caches compiled kernels for topoctl runs (the runtime points
    $TORCHINDUCTOR_CACHE_DIR there): $TOPOCTL_INDUCTOR_CACHE when set, else
    ``topoctl-inductor-<uid>`` in $XDG_CACHE_HOME or the temporary directory (ranks may run as
    an account without a home, `nobody`), so that runs of any plan by the same account share it
    and no other program's cache is touched."""
    if os.environ.get(OWN_CACHE_ENV):
        return os.environ[OWN_CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or tempfile.gettempdir()
    return os.path.join(base, f"topoctl-inductor-{os.getuid()}")
