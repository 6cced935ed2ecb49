"""Checkpoints of a data-parallel run, so that `topoctl run --heal` can resume it.

Every `checkpoint.every` iterations the first rank of each host writes the model's and the
optimizer's state to `RUN_DIR/checkpoints/it-<N>.pt` (N iterations done), atomically (a file
renamed into place) and keeps only the newest. Under data parallelism every rank holds the same
parameters, so one file per host is a full copy; each host keeps its own because on a real
cluster a host sees only its own disk.

On resume the ranks agree, with one all_gather, on the newest checkpoint any rank has and on the
lowest rank holding it (a host may have been stopped just before writing its last one); that rank
loads it and broadcasts the parameters and the optimizer state, so every rank starts the next
iteration identical. A checkpoint of another job (name, parameter count or world size) is
ignored. The trainer removes the directory after the last iteration of a successful run, and
the launcher removes it before a run that does not resume."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

NAME = re.compile(r"^it-(\d+)\.pt$")


def identity(job_name: str, model: Any, world: int) -> dict:
    """What a checkpoint must match to be resumed from: job name, parameter count, world."""
    return {"job": job_name, "params": sum(p.numel() for p in model.parameters()),
            "world": world}


class CheckpointDir:
    """One host's checkpoint directory."""

    def __init__(self, path: Path, ident: dict):
        self.path, self.ident = Path(path), ident

    def files(self) -> dict[int, Path]:
        """Iteration -> file, for every complete checkpoint here."""
        if not self.path.is_dir():
            return {}
        return {int(m.group(1)): p for p in self.path.iterdir() if (m := NAME.match(p.name))}

    def save(self, iteration: int, model: Any, optimizer: Any) -> Path:
        """Write the state after `iteration` iterations; remove older checkpoints."""
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        final = self.path / f"it-{iteration}.pt"
        tmp = final.with_suffix(".tmp")
        torch.save({"iteration": iteration, "identity": self.ident,
                    "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
        os.replace(tmp, final)  # a reader never sees half a file
        for it, p in self.files().items():
            if it < iteration:
                p.unlink(missing_ok=True)
        return final

    def latest(self) -> int:
        """The newest checkpoint of this job here (iterations done), 0 when there is none."""
        for it, p in sorted(self.files().items(), reverse=True):
            try:
                head = torch.load(p, map_location="cpu", weights_only=True)
            except Exception:  # unreadable (a truncated disk, another format): not resumable
                continue
            if head.get("identity") == self.ident and head.get("iteration") == it:
                return it
        return 0

    def load(self, iteration: int) -> dict:
        """The checkpoint after `iteration` iterations."""
        return torch.load(self.path / f"it-{iteration}.pt", map_location="cpu",
                          weights_only=True)

    def remove(self) -> None:
        """Remove every checkpoint (and the directory when it is then empty)."""
        for p in self.files().values():
            p.unlink(missing_ok=True)
        for p in self.path.glob("*.tmp") if self.path.is_dir() else []:
            p.unlink(missing_ok=True)
        try:
            self.path.rmdir()
        except OSError:
            pass


def agree(local: int) -> tuple[int, int]:
    """(iterations done, source rank): the newest checkpoint any rank has and the lowest rank
    that has it; (0, 0) when none has one. A collective: every rank calls it."""
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, local)
    best = max(got)
    return best, (got.index(best) if best else 0)


def restore_model(model: Any, state: dict | None, src: int) -> None:
    """Load `state` (on rank `src`) into `model` and send its tensors to every other rank."""
    if dist.get_rank() == src:
        model.load_state_dict(state["model"])
    for t in model.state_dict().values():
        dist.broadcast(t, src)


def restore_optimizer(optimizer: Any, state: dict | None, src: int) -> None:
    """Give every rank the optimizer state of rank `src`'s checkpoint (momentum, if any)."""
    box = [state["optimizer"] if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src)
    optimizer.load_state_dict(box[0])
