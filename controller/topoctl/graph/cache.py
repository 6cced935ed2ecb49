"""Profile cache: measured per-op costs keyed by model, sizes, batch, dtype, torch version and
CPU. One JSON file per key under $TOPOCTL_CACHE (default ~/.cache/topoctl/profiles)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import torch

from topoctl.graph.cost import OpCost, TrainCost


def cache_dir() -> Path:
    """The profile cache directory: $TOPOCTL_CACHE/profiles, default ~/.cache/topoctl/profiles."""
    return Path(os.environ.get("TOPOCTL_CACHE", Path.home() / ".cache" / "topoctl")) / "profiles"


def profile_key(model: str, params: dict, batch: int, dtype: str) -> str:
    """A short hash of everything a measured profile depends on (model, sizes, batch, dtype, torch,
    CPU, threads)."""
    ident = json.dumps({"model": model, "params": params, "batch": batch, "dtype": dtype,
                        "torch": torch.__version__, "cpu": platform.processor() or
                        platform.machine(), "threads": torch.get_num_threads()}, sort_keys=True)
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def load(key: str) -> dict[str, OpCost] | None:
    """The cached per-op costs under `key`, or None when absent or unreadable."""
    p = cache_dir() / f"{key}.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return {k: OpCost(*v) for k, v in data.items()}


def store(key: str, costs: dict[str, OpCost]) -> None:
    """Write per-op costs under `key` atomically (a temporary file renamed over it)."""
    _write(key, {k: [c.fwd, c.bwd] for k, c in costs.items()})


def _write(key: str, data: dict) -> None:
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(d / f"{key}.json")


def load_train(key: str) -> dict[str, TrainCost] | None:
    """The cached training costs (forward, both backwards, step) under `key`, or None when
    absent, unreadable or of another shape."""
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text())
        return {k: TrainCost(*(float(x) for x in v)) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def store_train(key: str, costs: dict[str, TrainCost]) -> None:
    """Write per-op training costs under `key` atomically."""
    _write(key, {k: [c.fwd, c.bwd_params, c.bwd_inputs, c.step] for k, c in costs.items()})
