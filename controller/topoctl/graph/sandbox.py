"""Model capture for `model.factory` jobs, as an unprivileged user (trust model: README).

A job file's `model.factory` names code that `topoctl plan` runs to build the model. As root,
`topoctl plan` runs it in a child process (topoctl.graph.capture_worker) as the user
$TOPOCTL_CAPTURE_USER (default `nobody`), with an empty home directory and no supplementary
groups (the child starts as root, loads the interpreter's libraries, then drops to that user
for good before the factory's module is imported); as any other user, in a child process as
that user. The child sees the parent's
Python path, so the factory must be readable by that user (a module under /root is not: the
error says so); when this interpreter is not (a pyenv under /root), the child runs the
system's python of the same version (`worker_python`). Results come back as plain JSON;
built-in catalog models are our own code and are captured in process."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import topoagent
import topoctl
from topoagent.target import usable_by_any_user
from topoctl.graph.capture import CaptureError
from topoctl.graph.cost import OpCost, TrainCost
from topoctl.graph.ops import Op, OpGraph

DEFAULT_USER = "nobody"
TIMEOUT_S = 1800.0  # timing a large model on this CPU takes minutes, never hours
_memo: dict[str, dict] = {}


def capture_user() -> str | None:
    """The user the factory runs as: $TOPOCTL_CAPTURE_USER or `nobody` when root; None (this
    process's own user) otherwise."""
    if os.geteuid() != 0:
        return None
    return os.environ.get("TOPOCTL_CAPTURE_USER") or DEFAULT_USER


def worker_python(user: str | None) -> tuple[str, list[str]]:
    """The interpreter for the capture child and its import path. This interpreter, unless the
    capture user could not read it (a pyenv under /root): then $TOPOCTL_CAPTURE_PYTHON or the
    system's python of the same major.minor (same ABI: the venv's wheels load), given only the
    parent's non-stdlib paths (its site-packages, the project, the job's modules)."""
    here = [os.path.abspath(p or ".") for p in sys.path]
    # the packages' own roots: an editable install reaches them through an import hook,
    # which a bare PYTHONPATH does not have
    roots = [str(Path(m.__file__).resolve().parents[1]) for m in (topoctl, topoagent)]
    python = os.environ.get("TOPOCTL_CAPTURE_PYTHON")
    if python is None and (user is None or usable_by_any_user(sys.executable)):
        return sys.executable, roots + here
    if python is None:
        python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    base = str(Path(sys.base_prefix).resolve())
    return python, roots + [p for p in here if "site-packages" in p
                            or not str(Path(p).resolve()).startswith(base)]


def _request(job, op: str, batch: int, dtype: str = "float32") -> dict:
    m = job.model
    return {"op": op, "factory": m.factory, "kwargs": m.kwargs, "batch": batch, "dtype": dtype,
            "threads": job.launch.threads,
            "inputs": [[list(i.shape), i.dtype, i.high] for i in m.inputs]}


def run_worker(req: dict, user: str | None = None) -> dict:
    """Run one capture request in a child process as `user` (None: as this process); the
    result document. CaptureError (path under `model`) for the factory's errors, an unknown
    user, a crash or a timeout."""
    key = json.dumps(req, sort_keys=True) + f"|{user}"
    if key in _memo:
        return _memo[key]
    home = tempfile.mkdtemp(prefix="topoctl-capture-")
    drop: list[str] = []
    try:
        if user is not None:
            try:
                pw = pwd.getpwnam(user)
            except KeyError:
                raise CaptureError(f"no user {user!r} to capture the model as "
                                   f"($TOPOCTL_CAPTURE_USER)", "factory") from None
            os.chown(home, pw.pw_uid, pw.pw_gid)
            # the child drops to the user itself, after loading the interpreter's libraries
            # (they may live where that user cannot read) and before the factory runs
            drop = [f"{pw.pw_uid}:{pw.pw_gid}"]
        python, path = worker_python(user)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
               "PYTHONPATH": os.pathsep.join(path), "PYTHONDONTWRITEBYTECODE": "1",
               "LANG": os.environ.get("LANG", "C.UTF-8")}
        try:
            p = subprocess.run([python, "-m", "topoctl.graph.capture_worker", *drop],
                               input=json.dumps(req), capture_output=True, text=True,
                               cwd=home, env=env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CaptureError(f"capturing {req['factory']} took over {TIMEOUT_S:.0f} s",
                               "factory") from None
        except OSError as e:  # no such interpreter: say which and how to choose another
            raise CaptureError(f"cannot start the capture interpreter {python}: "
                               f"{e.strerror or e} (set $TOPOCTL_CAPTURE_PYTHON)",
                               "factory") from None
        try:
            doc = json.loads(p.stdout)
            ok = doc["ok"] is True
        except (ValueError, TypeError, KeyError):
            tail = " | ".join(p.stderr.strip().splitlines()[-3:])
            raise CaptureError(f"capturing {req['factory']} as user {user or 'self'} "
                               f"failed (exit {p.returncode}): {tail}", "factory") from None
        if not ok:
            hint = (f"; the module must be readable by user {user}"
                    if user and "cannot import" in str(doc.get("problems")) else "")
            raise CaptureError([(f"{pth}" if pth else "factory",
                                 f"{msg} (captured as user {user or 'self'}{hint})")
                                for pth, msg in doc.get("problems") or [["", "failed"]]])
    finally:
        shutil.rmtree(home, ignore_errors=True)
    _memo[key] = doc
    return doc


def factory_graph(job, batch: int) -> OpGraph:
    """The op graph of the job's factory model at `batch` samples (meta device, no memory)."""
    g = run_worker(_request(job, "graph", batch, job.dtype), capture_user())["graph"]
    try:
        ops = [Op(**(o | {"inputs": tuple(o["inputs"]), "out_shape": tuple(o["out_shape"]),
                          "params": tuple(tuple(p) for p in o["params"])})) for o in g["ops"]]
        return OpGraph(model=str(g["model"]), batch=int(g["batch"]),
                       dtype_bytes=int(g["dtype_bytes"]), ops=ops)
    except (TypeError, KeyError, ValueError) as e:
        raise CaptureError(f"the capture process answered a malformed graph: {e}",
                           "factory") from None


def factory_costs(job, batch: int) -> dict[str, OpCost]:
    """Per-op forward/backward seconds of the factory model timed on this CPU at `batch`."""
    costs = run_worker(_request(job, "measure", batch), capture_user())["costs"]
    return {str(k): OpCost(float(f), float(b)) for k, (f, b) in costs.items()}


def factory_train_costs(job, batch: int, runtime: str = "module", corun: int = 0,
                        ddp_bucket_bytes: int | None = None) -> dict[str, TrainCost] | None:
    """Per-op training costs of the factory model at `batch` (fitted as `runtime` runs it,
    with `corun` copies beside it, through DDP with `ddp_bucket_bytes` buckets:
    `graph.cost.measure_train_costs`), or None when it cannot
    train on real tensors here."""
    doc = run_worker(_request(job, "train", batch) | {"runtime": runtime, "corun": corun,
                                                   "ddp_bucket_bytes": ddp_bucket_bytes},
                     capture_user())
    costs = doc["costs"]
    if costs is None:
        untimed(job.model.factory, batch, str(doc.get("why") or "no reason given"))
        return None
    return {str(k): TrainCost(*(float(x) for x in v)) for k, v in costs.items()}


_said: set[str] = set()  # the untimed warnings given by this process (each once)


def untimed(model: str, batch: int, why: str) -> None:
    """Say on stderr, once per model and reason, that a training step of `model` could not be
    timed (its per-op costs stay measured or modelled), and why: the plan is still made, but
    a cost that quietly changed source hides a model that does not train here."""
    key = f"{model}|{why}"
    if key not in _said:
        _said.add(key)
        print(f"topoctl: warning: timing a training step of {model} at batch {batch} failed "
              f"({why}); its per-op costs are not fitted to a whole step", file=sys.stderr)


def model_problems(factory: str, kwargs: dict, names: dict[str, tuple[str, str]]
                   ) -> list[tuple[str, str]]:
    """What is wrong with the model a plan's job builds, found before any rank starts: the
    factory (run in the capture child, as `capture_user`) must return a torch.nn.Module with
    every module, nn.Linear or parameter `names` lists ({yaml path: (name, kind)},
    `capture_worker.check_names`). Problems as (yaml path, message); CaptureError when the
    factory cannot be run at all."""
    doc = run_worker({"op": "check", "factory": factory, "kwargs": kwargs,
                      "names": {k: list(v) for k, v in names.items()}}, capture_user())
    return [(str(p), str(m)) for p, m in doc.get("problems") or []]

