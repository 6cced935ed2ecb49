"""The learned cost model of a fused region (DisCo's GNN simulator, Chen et al., TPDS; against
the simplest model that does as well): the seconds a region compiled as one takes (forward +
backward), from its ops (plain data, `regions.region_ops`) and their eager seconds.

`LaunchModel`, the simple one: t_fused = r * t_eager - a * (n - 1) - b * internal_bytes, the
eager time less what fusion removes: the per-op launch/dispatch of all but one op (a, seconds
per op: the eager framework's per-op work forward and backward) and the memory traffic of the
tensors that stay inside the region (b, seconds per byte); r absorbs the kernels' own change.
Fitted by least squares on the relative error (rows scaled by 1 / t_fused); O(samples).
`ConstantModel`: t_fused = r * t_eager, the median ratio (the floor any model must beat).
The GNN is in `gnn` (torch). Each model predicts ``predict(ops, eager_s) -> fused_s``, which
is what `costs.fused_costs` calls. Pure functions over plain data; numpy only."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

DENSE = frozenset({"linear", "conv1d", "conv2d", "conv3d", "matmul", "bmm", "mm", "addmm",
                   "baddbmm", "einsum"})
NORM = frozenset({"batchnorm1d", "batchnorm2d", "layernorm", "softmax", "log_softmax",
                  "groupnorm"})
POOL = frozenset({"maxpool2d", "avgpool2d", "adaptiveavgpool2d", "adaptive_avg_pool2d"})
LOOKUP = frozenset({"embedding", "embeddingbag"})
VIEWS = frozenset({"view", "reshape", "permute", "transpose", "flatten", "getitem", "size",
                   "contiguous", "expand", "unsqueeze", "squeeze", "get_attr", "getattr",
                   "chunk", "split", "t"})
CATEGORIES = ("dense", "norm", "pool", "lookup", "view", "elementwise")


def category(kind: str) -> str:
    """The op category the cost models see (`CATEGORIES`): everything not named is element-wise
    (activations, arithmetic, concatenation)."""
    for name, kinds in (("dense", DENSE), ("norm", NORM), ("pool", POOL), ("lookup", LOOKUP),
                        ("view", VIEWS)):
        if kind in kinds:
            return name
    return "elementwise"


def compute_ops(ops: list[dict]) -> int:
    """How many of the region's ops compute (views do not)."""
    return sum(category(o["kind"]) != "view" for o in ops)


def internal_bytes(ops: list[dict]) -> int:
    """Bytes of the tensors computed and consumed inside the region (each edge once): what a
    fused kernel need not write out and read back."""
    return sum(ops[i]["out_bytes"] for o in ops for i in o["inputs"]
               if category(ops[i]["kind"]) != "view")


def launch_features(ops: list[dict], eager_s: float) -> list[float]:
    """[t_eager, -(n - 1), -internal bytes]: `LaunchModel`'s design row."""
    return [eager_s, -float(max(compute_ops(ops) - 1, 0)), -float(internal_bytes(ops))]


@dataclass(frozen=True)
class LaunchModel:
    """t_fused = r * t_eager - a * (n - 1) - b * internal_bytes (see the module doc), never
    below a tenth of t_eager."""

    r: float
    a: float
    b: float

    def predict(self, ops: list[dict], eager_s: float) -> float:
        """Seconds of the fused region."""
        x = launch_features(ops, eager_s)
        return max(self.r * x[0] + self.a * x[1] + self.b * x[2], 0.1 * eager_s)

    @classmethod
    def fit(cls, samples: list[dict]) -> LaunchModel:
        """Least squares of the relative error over `samples` (``ops``, ``eager_s``,
        ``fused_s``); a and b are kept >= 0 (fusion removes work, never adds it)."""
        x = np.array([launch_features(s["ops"], s["eager_s"]) for s in samples])
        y = np.array([s["fused_s"] for s in samples])
        w = 1.0 / y
        coef = _nonneg_lstsq(x * w[:, None], y * w, nonneg=(1, 2))
        return cls(*(float(c) for c in coef))


def _nonneg_lstsq(a: np.ndarray, y: np.ndarray, nonneg: tuple[int, ...]) -> np.ndarray:
    """Least squares with the coefficients `nonneg` clamped at 0 (refit without them when the
    free solution is negative there: an active-set step, enough for three coefficients)."""
    cols = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        coef[cols] = np.linalg.lstsq(a[:, cols], y, rcond=None)[0]
        bad = [c for c in nonneg if c in cols and coef[c] < 0]
        if not bad:
            return coef
        cols.remove(min(bad, key=lambda c: coef[c]))


@dataclass(frozen=True)
class ConstantModel:
    """t_fused = r * t_eager with r the median ratio of the training samples."""

    r: float

    def predict(self, ops: list[dict], eager_s: float) -> float:
        """Seconds of the fused region."""
        return self.r * eager_s

    @classmethod
    def fit(cls, samples: list[dict]) -> ConstantModel:
        """The median fused / eager ratio of `samples`."""
        return cls(statistics.median(s["fused_s"] / s["eager_s"] for s in samples))


def relative_errors(predict, samples: list[dict]) -> list[float]:
    """|predicted - measured| / measured fused seconds of every sample."""
    return [abs(predict(s["ops"], s["eager_s"]) - s["fused_s"]) / s["fused_s"]
            for s in samples]


def summary(errors: list[float]) -> dict[str, float]:
    """Mean, median and worst of relative errors (in %), rounded."""
    if not errors:
        return {"mean": math.nan, "median": math.nan, "max": math.nan}
    return {"mean": round(100 * statistics.fmean(errors), 1),
            "median": round(100 * statistics.median(errors), 1),
            "max": round(100 * max(errors), 1)}
