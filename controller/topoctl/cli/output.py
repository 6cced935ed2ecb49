"""Helpers the `topoctl` verb modules share (imported by them; the package's `__init__` only
collects the verbs): `write_output`, a plan or document written atomically."""

from __future__ import annotations

import os
from pathlib import Path

from topoagent.state.host import StateError


def write_output(path: str, text: str, flag: str = "-o") -> None:
    """Write `text` to `path` atomically (a temporary file renamed over it: a reader never sees
    half a file); StateError naming `flag` when the directory is missing or not writable."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StateError(f"cannot write {path}: {e.strerror or e}", source=flag) from None
