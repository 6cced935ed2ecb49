"""A Horovod-style autotune of the fusion cap (Sergeev & Del Balso, "Horovod", 2018; its
`HOROVOD_AUTOTUNE`: Bayesian optimisation of the fusion buffer threshold with a Gaussian
process and expected improvement, a few warm-up samples, at most 20 samples).

Here the objective is the caller's `cost(cap_bytes)` (a simulated or measured iteration); the
cap is searched on a log2 scale between `lo` and `hi` bytes. A GP with an RBF kernel (length
1 in log2 bytes, noise 1e-6 of the variance) over the samples so far, the next sample the
grid point of highest expected improvement. Deterministic (fixed warm-up points, a fixed
grid). O(samples^3 + samples * grid) besides the `samples` cost evaluations.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["autotune_cap"]

MB = 1 << 20


def _posterior(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GP mean and standard deviation on `grid` given samples (x, y), y standardised."""
    def k(a, b):
        return np.exp(-0.5 * (a[:, None] - b[None, :]) ** 2)

    kxx = k(x, x) + 1e-6 * np.eye(len(x))
    kgx = k(grid, x)
    alpha = np.linalg.solve(kxx, y)
    mean = kgx @ alpha
    var = 1.0 - np.einsum("ij,ji->i", kgx, np.linalg.solve(kxx, kgx.T))
    return mean, np.sqrt(np.maximum(var, 1e-12))


def _expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """EI of minimisation below `best`."""
    z = (best - mean) / sd
    cdf = 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return (best - mean) * cdf + sd * pdf


def autotune_cap(cost: Callable[[int], float], lo: int = MB, hi: int = 256 * MB,
                 samples: int = 12, warmup: int = 3) -> tuple[int, float, list[tuple[int, float]]]:
    """(best cap in bytes, its cost, every (cap, cost) sampled in order)."""
    a, b = math.log2(lo), math.log2(hi)
    grid = np.linspace(a, b, 64)
    xs = list(np.linspace(a, b, warmup))
    ys = [cost(int(2 ** x)) for x in xs]
    while len(xs) < samples:
        y = np.array(ys)
        sd = y.std() or 1.0
        mean, s = _posterior(np.array(xs), (y - y.mean()) / sd, grid)
        ei = _expected_improvement(mean, s, (y.min() - y.mean()) / sd)
        for x in xs:  # never sample a point twice
            ei[np.isclose(grid, x)] = -np.inf
        nxt = float(grid[int(np.argmax(ei))])
        if not np.isfinite(ei.max()):
            break
        xs.append(nxt)
        ys.append(cost(int(2 ** nxt)))
    sampled = [(int(2 ** x), float(t)) for x, t in zip(xs, ys, strict=True)]
    cap, t = min(sampled, key=lambda s: (s[1], s[0]))
    return cap, t, sampled
