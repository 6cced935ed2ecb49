"""Launch and supervise this host's training processes (`topo-agent launch`, `topo-agent stop`).

The controller streams the plan's job spec; the agent starts this host's ranks with their
environment (inside the target namespace), prefixes every output line with `[rank N]`, and
exits when all ranks end. If one rank dies the others are stopped at once and the agent exits
1 after printing a `failed` event with the rank, its exit code and its last lines, so the
controller can stop every other host. Process groups are recorded in a pid file for `stop`.

When the job spec names interfaces to watch for this host (`watch`, added by `topoctl run`),
their carrier is polled (`topoagent.process.linkwatch`): a lost one stops this host's ranks
at once and the launcher exits 1 after a `link-down` event naming the interface, instead of the
ranks waiting for gloo's timeout. Checkpoints (`checkpoint`) live in `RUN_DIR/checkpoints`,
passed to the ranks as $TOPOCTL_RUN_DIR; a launch that does not resume removes old ones first."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from topoagent.observe import nldump
from topoagent.process.linkwatch import LinkDown, LinkWatch
from topoagent.protocol import TopoError
from topoagent.state.wire import LaunchSpec
from topoagent.target import Target

TAIL = 15  # last lines of a failed rank worth showing
CHECKPOINTS = "checkpoints"  # under the run directory (topotrain.checkpoint writes it)
CLONE_NEWUTS = 0x04000000


class LaunchError(TopoError, RuntimeError):
    """This host cannot launch the job (no ranks here, an earlier job still running)."""


def _argv(command: list[str]) -> list[str]:
    """`python`/`python3` means this installation's interpreter: the one with torch and the
    collectives, whatever else is first on the PATH of a non-login SSH session."""
    if command and command[0] in ("python", "python3"):
        return [sys.executable, *command[1:]]
    return list(command)


def _emit(lock: threading.Lock, line: str) -> None:
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def launch(job: LaunchSpec, host: str, target: Target, run_dir: Path,
           timeout: float | None = None) -> int:
    """Start `host`'s ranks of `job` inside `target`, supervise them until all end (or one
    fails, or `timeout` seconds pass) and return the exit code: 0 all ranks ended well, 1 one
    failed (a `failed` event names it). LaunchError when this host runs no rank or an earlier
    job's ranks still run here. The job spec goes to the ranks as `run_dir/job.json`."""
    procs_spec = job.processes.get(host)
    if not procs_spec:
        raise LaunchError("this host runs no rank", f"job.processes.{host}")
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file = run_dir / "job.json"
    job_file.write_text(json.dumps(job.to_dict()))
    pidfile = run_dir / "job.pids"
    if pidfile.exists() and any(_alive(int(p)) for p in pidfile.read_text().split()):
        raise LaunchError(f"ranks of an earlier job still run here ({pidfile}): "
                          "topo-agent stop first")
    if not job.checkpoint.resume:  # a fresh run must never pick up an earlier run's state
        shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
    lock = threading.Lock()
    tripped = threading.Event()
    watch = _watch(job.watch.get(host, []), target, lock, tripped)
    if tripped.is_set():  # a watched interface is down already: starting ranks cannot help
        watch.stop()
        return 1
    children: list[tuple[int, subprocess.Popen, deque]] = []
    try:
        for spec in procs_spec:
            rank = spec.rank
            env = {**os.environ, **spec.env, "TOPOCTL_JOB": str(job_file),
                   "TOPOCTL_RUN_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"}
            bind = spec.bind_address or env.get("TOPOCTL_BIND_ADDRESS")
            p = subprocess.Popen(_argv(job.command), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                 preexec_fn=_child_setup(target, bind))
            tail: deque = deque(maxlen=TAIL)
            children.append((rank, p, tail))
            threading.Thread(target=_pump, args=(rank, p, tail, lock), daemon=True).start()
        pidfile.write_text(" ".join(str(p.pid) for _, p, _ in children))
        return _supervise(children, lock, timeout, tripped)
    finally:
        watch.stop()
        _stop_all(children)
        pidfile.unlink(missing_ok=True)


def _watch(interfaces: list[str], target: Target, lock: threading.Lock,
           tripped: threading.Event) -> LinkWatch:
    """Watch `interfaces` inside `target`: the first one down is emitted as a `link-down`
    event and sets `tripped` (checked at once, then polled)."""
    def on_down(d: LinkDown) -> None:
        _emit(lock, json.dumps({"event": "link-down", "interface": d.interface,
                                "reason": d.reason, "at": d.at}))
        tripped.set()

    watch = LinkWatch(nldump.open_in(target.inside), interfaces, on_down)
    if interfaces:
        first = watch.check()
        if first is not None:
            on_down(first)
            return watch
        watch.start()
    return watch


def _child_setup(target: Target, bind: str | None):
    """In the child, before exec: enter the host's namespace, and give the rank its own UTS
    namespace whose hostname is its training address. Gloo's default device binds the address
    the hostname resolves to (and silently falls back to 127.0.0.1 when that is not local), and
    torch ignores pg_options for gloo, so this is how a rank binds its training address, which
    lives on lo next to 127.0.0.1 (GLOO_SOCKET_IFNAME=lo would pick 127.0.0.1)."""
    def setup() -> None:
        target.enter()
        if bind:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWUTS) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS)")
            socket.sethostname(bind)
    return setup


def _pump(rank: int, p: subprocess.Popen, tail: deque, lock: threading.Lock) -> None:
    assert p.stdout is not None
    for raw in p.stdout:
        line = raw.rstrip("\n")
        tail.append(line)
        _emit(lock, f"[rank {rank}] {line}")


def _supervise(children, lock: threading.Lock, timeout: float | None,
               tripped: threading.Event) -> int:
    deadline = time.monotonic() + timeout if timeout else None
    while True:
        if tripped.is_set():  # a watched link is down: the link-down event says which
            return 1
        running = 0
        for rank, p, tail in children:
            rc = p.poll()
            if rc is None:
                running += 1
            elif rc != 0:
                time.sleep(0.2)  # let the pump thread drain the last lines
                _emit(lock, json.dumps({"event": "failed", "rank": rank, "rc": rc,
                                        "last": list(tail)}))
                return 1
        if not running:
            return 0
        if deadline and time.monotonic() > deadline:
            _emit(lock, json.dumps({"event": "failed", "rank": children[0][0], "rc": None,
                                    "last": ["timed out"]}))
            return 1
        time.sleep(0.1)


def _stop_all(children) -> None:
    for _, p, _ in children:
        if p.poll() is None:
            _killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + 5
    for _, p, _ in children:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _killpg(p.pid, signal.SIGKILL)
            p.wait()


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def stop(run_dir: Path) -> int:
    """Stop the ranks of a running `launch` on this host; the number of ranks signalled."""
    pidfile = run_dir / "job.pids"
    if not pidfile.exists():
        return 0
    pids = [int(p) for p in pidfile.read_text().split()]
    for pid in pids:
        _killpg(pid, signal.SIGTERM)
    return len(pids)
