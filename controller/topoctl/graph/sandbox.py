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
built-in catalog models are our own code and are captured in process. Within a `session` (a
planning call) one child per factory module answers every request, one JSON line each;
answers are memoised per process while the job's source files are unchanged (`run_worker`)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import pwd
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

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


@dataclass
class _Worker:
    """One capture child serving requests over its stdin/stdout (`capture_worker.serve`)."""
    proc: subprocess.Popen
    home: str  # its empty home directory and working directory, removed with it
    err: IO[bytes]  # its stderr (the factory's prints), read back when it fails
    files: list = field(default_factory=list)  # the job's source files it loaded (`_fresh`)


@dataclass
class _Session:
    """The capture children of one planning call (`session`), one per user, interpreter,
    import path and factory module; usable only by the process that opened it."""
    pid: int = field(default_factory=os.getpid)
    workers: dict[tuple, _Worker] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar(
    "topoctl_capture_session", default=None)


@contextlib.contextmanager
def session() -> Iterator[None]:
    """While inside, the capture requests of this process share one child per factory module
    (and user, interpreter, import path): it imports torch once and answers every graph,
    timing and check request of the call, instead of one child of ~3 CPU-s per request (a
    factory job's plan asks for its graph, its op times and its training steps). The
    children end when the outermost `session` exits; nested ones join it. Outside any
    session each request has a child of its own, as `session` would for one request."""
    if _SESSION.get() is not None:
        yield
        return
    token = _SESSION.set(_Session())
    try:
        yield
    finally:
        ses = _SESSION.get()
        _SESSION.reset(token)
        for w in ses.workers.values():
            _close(w)


def _start(user: str | None, python: str, path: list[str]) -> _Worker:
    """A new capture child as `user` (None: this process's user) running `python` with
    `path`, in an empty home directory; CaptureError for an unknown user or interpreter."""
    home = tempfile.mkdtemp(prefix="topoctl-capture-")
    try:
        drop: list[str] = []
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
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
               "PYTHONPATH": os.pathsep.join(path), "PYTHONDONTWRITEBYTECODE": "1",
               "LANG": os.environ.get("LANG", "C.UTF-8")}
        err = tempfile.TemporaryFile()  # a file, not a pipe: a chatty factory never blocks
        try:
            proc = subprocess.Popen([python, "-m", "topoctl.graph.capture_worker", *drop],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err, cwd=home, env=env)
        except OSError as e:  # no such interpreter: say which and how to choose another
            err.close()
            raise CaptureError(f"cannot start the capture interpreter {python}: "
                               f"{e.strerror or e} (set $TOPOCTL_CAPTURE_PYTHON)",
                               "factory") from None
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    return _Worker(proc, home, err)


def _close(w: _Worker, kill: bool = False) -> None:
    """End the child (end of input, then killed if it does not exit within 30 s, or at once
    with `kill`) and remove its home directory."""
    try:
        if not kill:
            with contextlib.suppress(OSError):
                w.proc.stdin.close()
            try:
                w.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill = True
        if kill:
            w.proc.kill()
            w.proc.wait()
    finally:
        for f in (w.proc.stdin, w.proc.stdout, w.err):
            with contextlib.suppress(OSError):
                f.close()
        shutil.rmtree(w.home, ignore_errors=True)


def _stderr_tail(w: _Worker) -> str:
    """The last three lines the child wrote on stderr, joined by ` | `."""
    w.err.seek(max(0, w.err.seek(0, os.SEEK_END) - 8192))
    lines = w.err.read().decode(errors="replace").strip().splitlines()
    return " | ".join(lines[-3:])


def _read_line(w: _Worker, deadline: float) -> bytes | None:
    """The child's next answer line, b"" when it closed its stdout (exited), None when
    `deadline` (time.monotonic) passed first."""
    fd = w.proc.stdout.fileno()
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            buf += chunk
    return buf


def _ask(w: _Worker, req: dict, user: str | None) -> dict:
    """Send `req` to the child, its answer document (ok or not). CaptureError when it
    crashed, answered no JSON or took over TIMEOUT_S; the child is then killed."""
    try:
        w.proc.stdin.write(json.dumps(req).encode() + b"\n")
        w.proc.stdin.flush()
        line = _read_line(w, time.monotonic() + TIMEOUT_S)
    except OSError:  # it exited before reading the request: its stderr says why
        line = b""
    if line is None:
        _close(w, kill=True)
        raise CaptureError(f"capturing {req['factory']} took over {TIMEOUT_S:.0f} s",
                           "factory")
    try:
        doc = json.loads(line)
        if doc["ok"] is not True and doc["ok"] is not False:
            raise ValueError(doc["ok"])
        return doc
    except (ValueError, TypeError, KeyError):
        try:
            code = w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        tail = _stderr_tail(w)
        _close(w, kill=True)
        raise CaptureError(f"capturing {req['factory']} as user {user or 'self'} "
                           f"failed (exit {code}): {tail}", "factory") from None


def _fresh(files: list) -> bool:
    """Whether the job's source files ([path, device, inode, size, mtime_ns, ctime_ns],
    `capture_worker.source_files`) are unchanged since the child imported them. Their status
    only: this process (root) never reads a file the child names."""
    for path, *seen in files:
        try:
            st = os.stat(path)
        except OSError:
            return False
        if [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] != seen:
            return False
    return True


def _answer(req: dict, user: str | None, python: str, path: list[str]) -> dict:
    """The child's answer to `req`: from this call's `session` child for the factory's module
    (a new one if there is none, or if the job's files it loaded changed since), else from a
    child of its own."""
    ses = _SESSION.get()
    if ses is None or ses.pid != os.getpid():  # a fork must not talk over its parent's pipes
        w = _start(user, python, path)
        try:
            return _ask(w, req, user)
        finally:
            _close(w)
    key = (user, python, tuple(path), str(req["factory"]).partition(":")[0])
    with ses.lock:
        w = ses.workers.get(key)
        if w is not None and (w.proc.poll() is not None or not _fresh(w.files)):
            _close(w, kill=True)  # edited since it imported them: a fresh import
            w = None
        if w is None:
            w = ses.workers[key] = _start(user, python, path)
        try:
            doc = _ask(w, req, user)
        except CaptureError:
            del ses.workers[key]  # killed by _ask
            raise
        w.files = doc.get("files") or w.files
        return doc


def run_worker(req: dict, user: str | None = None) -> dict:
    """Run one capture request in a child process as `user` (None: as this process); the
    result document. Answers are memoised for the life of this process, keyed on the
    request, the user, the interpreter and its import path, and valid while the job's
    source files the factory loaded are unchanged (`_fresh`): the same capture is not run
    twice. CaptureError (path under `model`) for the factory's errors, an unknown user, a
    crash or a timeout."""
    python, path = worker_python(user)
    key = json.dumps([req, user, python, path], sort_keys=True)
    hit = _memo.get(key)
    if hit is not None and _fresh(hit.get("files") or []):
        return hit
    doc = _answer(req, user, python, path)
    if doc["ok"] is not True:
        hint = (f"; the module must be readable by user {user}"
                if user and "cannot import" in str(doc.get("problems")) else "")
        raise CaptureError([(f"{pth}" if pth else "factory",
                             f"{msg} (captured as user {user or 'self'}{hint})")
                            for pth, msg in doc.get("problems") or [["", "failed"]]])
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

