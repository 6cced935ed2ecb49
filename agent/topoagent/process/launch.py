"""Launch and supervise this host's training processes (`topo-agent launch`, `topo-agent stop`).

The controller streams the plan's job spec; the agent starts this host's ranks with their
environment (inside the target namespace, as the job's unprivileged user: `process.ranks`),
prefixes every output line with `[rank N]`, and exits when all ranks end. If one rank dies the
others are stopped at once and the agent exits 1 after printing a `failed` event with the rank,
its exit code and its last lines, so the controller can stop every other host.

Events travel apart from output: each rank gets a pipe of its own, its write end passed as the
file descriptor named by $TOPOCTL_EVENT_FD (`topotrain.events`); the launcher forwards what
comes through it as `[event N] LINE`. Its own events (`failed`, `link-down`, `warning`) are bare
JSON lines. Whatever a rank prints (a forged event included) only ever reaches the controller
behind `[rank N]`, with control characters replaced, so no rank output can pass as an event.

No process outlives its supervisor: the launcher dies with its parent (PR_SET_PDEATHSIG) and
with the controller's end of its output (a closed pipe or SSH channel), stopping its ranks on
SIGTERM, SIGHUP or SIGINT; each rank is killed when the launcher dies (PR_SET_PDEATHSIG).
Rank process groups are recorded with their start times for `stop` (`process.pidfile`), which
signals only processes that are still the ranks recorded. `stop` first leaves a note with its
reason (`STOP_NOTE`): ranks that end after it are reported as a `stopped` event with that
reason (exit 130), not as a failure, so that `topoctl run` can say the job was stopped.

When the job spec names interfaces to watch for this host (`watch`, added by `topoctl run`),
their carrier is polled (`topoagent.process.linkwatch`): a lost one stops this host's ranks
at once and the launcher exits 1 after a `link-down` event naming the interface, instead of the
ranks waiting for gloo's timeout. Checkpoints (`checkpoint`) live in the ranks' directory
(`ranks.rank_dir`), passed to the ranks as $TOPOCTL_RUN_DIR; a launch that does not resume
empties it first.

$TOPO_RANK_CGROUP (set by the namespace lab, `topoctl.lab`) names a control group's
`cgroup.procs` file: each rank joins that group before it execs, so a lab host's CPU quota (the
compute of the devices the lab host stands for) holds the ranks, and only them; the agent and
the host's sshd, the management plane a real host runs on cores of its own, are not held to it."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from topoagent.apply.confirm import expired_orphan
from topoagent.apply.store import Store
from topoagent.observe import nldump
from topoagent.process.linkwatch import LinkDown, LinkWatch
from topoagent.process.pidfile import PidFileError, live, read_pids, write_pids
from topoagent.process.ranks import (
    RankUser,
    drop_privileges,
    prepare_rank_dir,
    python_for,
    rank_user,
    remove_if_unused,
    write_job_spec,
)
from topoagent.protocol import EXIT_INTERRUPTED, STOP_BY_OPERATOR, TopoError
from topoagent.signals import only_here
from topoagent.state.wire import TREE_SCHEDULE_ENV, TREE_SCHEDULE_FILE, LaunchSpec
from topoagent.target import Target

TAIL = 15  # last lines of a failed rank worth showing
CHECKPOINTS = "checkpoints"  # under the ranks' directory (topotrain.checkpoint writes it)
ORPHAN_LOOK_S = 2.0  # how often a launcher looks for an unconfirmed apply whose watchdog is gone
CLONE_NEWUTS = 0x04000000
PR_SET_PDEATHSIG = 1
EVENT_FD_ENV = "TOPOCTL_EVENT_FD"  # the rank's end of its event pipe (topotrain.events)
MAX_LINE = 65536  # longer output lines are cut into pieces of this many bytes
# how long the lines a rank wrote before it ended may take to be forwarded (its pipes reach
# their end when it exits, unless a process it left behind holds them open)
DRAIN_S = 5.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
STOP_NOTE = "job.stopped"  # in the run directory: why `stop` stopped the ranks (one line)
# what a forwarded line may not contain: anything a reader could take for a line break, and
# other control characters (terminal escapes)
_UNSAFE = {c: "?" for c in [*range(0x20), 0x7f, 0x85, 0x2028, 0x2029] if c != 0x09}


class LaunchError(TopoError, RuntimeError):
    """This host cannot launch the job (no ranks here, an earlier job still running)."""


class _Stopped(BaseException):  # noqa: N818 - a signal, not an error
    """SIGTERM or SIGHUP reached the launcher: stop the ranks and leave."""


class _Output:
    """The launcher's stdout (the controller's stream), shared by the pump threads: one line at
    a time, and whether the reader went away (a closed pipe or SSH channel)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gone = False

    def emit(self, line: str) -> None:
        """Write one line; a reader that left only sets `gone`."""
        with self.lock:
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                self.gone = True

    def reader_left(self) -> bool:
        """Whether the controller's end of stdout is closed (POLLERR/POLLHUP on a pipe or
        socket; never for a file or terminal)."""
        if self.gone:
            return True
        p = select.poll()
        try:
            p.register(sys.stdout.fileno(), 0)  # errors and hang-ups are always reported
            self.gone = any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
        except (OSError, ValueError):
            pass
        return self.gone


def _argv(command: list[str], user: RankUser, factory: str | None
          ) -> tuple[list[str], dict[str, str]]:
    """The rank's argv and extra environment. `python`/`python3` means this installation's
    interpreter (the one with torch and the collectives, whatever else is first on the PATH of
    a non-login SSH session), or one the rank's user can run (`ranks.python_for`)."""
    if command and command[0] in ("python", "python3"):
        python, env = python_for(user, factory)
        return [python, *command[1:]], env
    return list(command), {}


def launch(job: LaunchSpec, host: str, target: Target, run_dir: Path,
           timeout: float | None = None) -> int:
    """Start `host`'s ranks of `job` inside `target`, supervise them until all end (or one
    fails, or `timeout` seconds pass, or the launcher is told to stop) and return the exit
    code: 0 all ranks ended well, 1 one failed (a `failed` event names it), 130 stopped by a
    signal or by the controller going away. LaunchError when this host runs no rank or an
    earlier job's ranks still run here."""
    procs_spec = job.processes.get(host)
    if not procs_spec:
        raise LaunchError("this host runs no rank", f"job.processes.{host}")
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    pidfile = run_dir / "job.pids"
    _refuse_if_running(pidfile)
    (run_dir / STOP_NOTE).unlink(missing_ok=True)  # an earlier job's stop
    user = rank_user(job.user)
    out = _Output()
    if user.is_root:
        out.emit(json.dumps({"event": "warning", "message": "the ranks run as root "
                             "(job.user: root): the job's command has every power on "
                             "this host"}))
    ranks_dir = prepare_rank_dir(run_dir, user, fresh=not job.checkpoint.resume)
    job_file = write_job_spec(ranks_dir, json.dumps(job.to_dict()), user)
    launch_env = {"TOPOCTL_JOB": str(job_file), **_launch_files(job, ranks_dir, user)}
    cgroup = rank_cgroup()  # a wrong $TOPO_RANK_CGROUP is refused before any rank starts
    with _stop_on_signals():
        return _run(job, host, target, pidfile, ranks_dir, launch_env, user, out, timeout,
                    cgroup)


RANK_CGROUP_ENV = "TOPO_RANK_CGROUP"


def rank_cgroup() -> Path | None:
    """The `cgroup.procs` file every rank joins ($TOPO_RANK_CGROUP), None when unset.
    LaunchError unless it is an existing `cgroup.procs` file under /sys/fs/cgroup."""
    value = os.environ.get(RANK_CGROUP_ENV)
    if not value:
        return None
    path = Path(value)
    if (not path.is_absolute() or path.name != "cgroup.procs" or ".." in path.parts
            or path.parts[:4] != ("/", "sys", "fs", "cgroup") or not path.is_file()):
        raise LaunchError(f"${RANK_CGROUP_ENV}={value} is not the cgroup.procs file of a "
                          "control group under /sys/fs/cgroup", RANK_CGROUP_ENV)
    return path


def _launch_files(job: LaunchSpec, ranks_dir: Path, user: RankUser) -> dict[str, str]:
    """Files the plan hands the ranks beside the job spec, and the variables naming them: the
    schedule of a `trees` collective in $TOPO_TREE_SCHEDULE, which the runtime's DDP hook
    (`register_tree_hook(model)` in a user's own script) reads."""
    coll = job.collective
    if coll.get("algorithm") != "trees" or not isinstance(coll.get("schedule"), dict):
        return {}
    path = write_job_spec(ranks_dir, json.dumps(coll["schedule"]), user, TREE_SCHEDULE_FILE)
    return {TREE_SCHEDULE_ENV: str(path)}


def _run(job: LaunchSpec, host: str, target: Target, pidfile: Path, ranks_dir: Path,
         launch_env: dict[str, str], user: RankUser, out: _Output, timeout: float | None,
         cgroup: Path | None = None) -> int:
    """Start the ranks and supervise them; whatever happens, stop every rank left and drop
    the pid file and the ranks' directory (unless it holds checkpoints)."""
    tripped = threading.Event()
    watch = None
    children: list[_Rank] = []
    try:
        _die_with_parent()
        watch = _watch(job.watch.get(host, []), target, out, tripped)
        if tripped.is_set():  # a watched interface is down already: starting ranks cannot help
            return 1
        for spec in job.processes[host]:
            children.append(_start(job, spec, target, ranks_dir, launch_env, user, out,
                                   cgroup))
        write_pids(pidfile, [c.process.pid for c in children])
        return _supervise(children, out, timeout, tripped, target, pidfile.parent / STOP_NOTE)
    except _Stopped:
        return EXIT_INTERRUPTED
    finally:
        with _signals_ignored():  # a second signal must not cut the cleanup short
            if watch is not None:
                watch.stop()
            _stop_all(children)
            pidfile.unlink(missing_ok=True)
            (pidfile.parent / STOP_NOTE).unlink(missing_ok=True)
            remove_if_unused(ranks_dir)


def _refuse_if_running(pidfile: Path) -> None:
    """LaunchError when ranks of an earlier launch still run here; a stale or unreadable pid
    file is reported on stderr and ignored (it names no process of ours)."""
    try:
        entries = read_pids(pidfile)
    except PidFileError as e:
        print(f"topo-agent: ignoring {e}", file=sys.stderr)
        return
    if live(entries):
        raise LaunchError(f"ranks of an earlier job still run here ({pidfile}): "
                          "topo-agent stop first")
    if entries:
        print(f"topo-agent: ignoring the stale pid file {pidfile} (its ranks are gone)",
              file=sys.stderr)


@dataclass
class _Rank:
    """A started rank: its process, the last lines it printed, and the threads forwarding
    its output and its events."""

    rank: int
    process: subprocess.Popen
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL))
    pumps: list[threading.Thread] = field(default_factory=list)

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Wait until what the rank wrote before it ended is forwarded: without this, an
        event written just before it exited (its `done`) could be lost with the launcher."""
        end = time.monotonic() + timeout
        for t in self.pumps:
            t.join(max(0.0, end - time.monotonic()))


def _start(job: LaunchSpec, spec, target: Target, ranks_dir: Path, launch_env: dict[str, str],
           user: RankUser, out: _Output, cgroup: Path | None = None) -> _Rank:
    """Start one rank with its event pipe, and the threads that forward its output and its
    events; `launch_env` names the launch's files (the job spec, the tree schedule); the rank
    joins the control group whose `cgroup.procs` is `cgroup` (None: the launcher's)."""
    argv, extra = _argv(job.command, user, job.model.factory)
    read_end, write_end = os.pipe()
    env = {**os.environ, **extra, **spec.env, **launch_env, "HOME": str(ranks_dir),
           "USER": user.name, "LOGNAME": user.name,
           "TOPOCTL_RUN_DIR": str(ranks_dir), EVENT_FD_ENV: str(write_end),
           "PYTHONUNBUFFERED": "1"}
    if "PYTHONPATH" in extra and "PYTHONPATH" in spec.env:
        env["PYTHONPATH"] = os.pathsep.join([spec.env["PYTHONPATH"], extra["PYTHONPATH"]])
    bind = spec.bind_address or env.get("TOPOCTL_BIND_ADDRESS")
    try:
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, cwd=ranks_dir, start_new_session=True,
                             pass_fds=(write_end,),
                             preexec_fn=_child_setup(target, bind, user, os.getpid(),
                                                     cgroup))
    finally:
        os.close(write_end)
    started = _Rank(spec.rank, p)
    for stream, prefix, keep in ((p.stdout, "rank", started.tail),
                                 (os.fdopen(read_end, "rb"), "event", None)):
        t = threading.Thread(target=_pump, args=(stream, f"[{prefix} {spec.rank}] ", out, keep),
                             daemon=True)
        t.start()
        started.pumps.append(t)
    return started


def _watch(interfaces: list[str], target: Target, out: _Output,
           tripped: threading.Event) -> LinkWatch:
    """Watch `interfaces` inside `target`: the first one down is emitted as a `link-down`
    event and sets `tripped` (checked at once, then polled)."""
    def on_down(d: LinkDown) -> None:
        out.emit(json.dumps({"event": "link-down", "interface": d.interface,
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


def _child_setup(target: Target, bind: str | None, user: RankUser, parent: int,
                 cgroup: Path | None = None):
    """In the child, before exec: join the control group `cgroup` (its `cgroup.procs` file;
    None: stay in the launcher's), enter the host's namespace, and give the rank its own UTS
    namespace whose hostname is its training address. Gloo's default device binds the address
    the hostname resolves to (and silently falls back to 127.0.0.1 when that is not local), and
    torch ignores pg_options for gloo, so this is how a rank binds its training address, which
    lives on lo next to 127.0.0.1 (GLOO_SOCKET_IFNAME=lo would pick 127.0.0.1). Then become
    the rank's user, and die with the launcher (set after the user change, which clears it)."""
    def setup() -> None:
        if cgroup is not None:
            cgroup.write_text(str(os.getpid()))
        target.enter()
        libc = ctypes.CDLL(None, use_errno=True)
        if bind:
            if libc.unshare(CLONE_NEWUTS) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS)")
            socket.sethostname(bind)
        drop_privileges(user)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the launcher died before the line above
            os._exit(1)
    return setup


def _die_with_parent() -> None:
    """SIGTERM to this launcher when its parent ends (the controller's process, or the sshd
    session when the connection is lost); _Stopped when it has already ended."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:
        raise _Stopped(signal.SIGTERM)


class _stop_on_signals:  # noqa: N801 - used as a context manager, named like one
    """SIGTERM and SIGHUP raise _Stopped in the launcher's main thread while inside."""

    def __enter__(self) -> None:
        def stop(signum, frame) -> None:
            raise _Stopped(signum)

        main = threading.current_thread() is threading.main_thread()  # handlers live there
        self.old = ({s: signal.signal(s, only_here(stop)) for s in STOP_SIGNALS} if main
                    else {})

    def __exit__(self, *exc) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


class _signals_ignored(_stop_on_signals):  # noqa: N801
    """SIGTERM, SIGHUP and SIGINT only noted while inside (the cleanup runs to its end)."""

    def __enter__(self) -> None:
        sigs = (*STOP_SIGNALS, signal.SIGINT)
        main = threading.current_thread() is threading.main_thread()
        self.old = ({s: signal.signal(s, only_here(lambda signum, frame: None))
                     for s in sigs} if main else {})


def _pump(stream: IO[bytes], prefix: str, out: _Output, tail: deque | None) -> None:
    """Forward each line of `stream` behind `prefix` (control characters replaced); keep the
    last ones in `tail`."""
    with stream:
        while raw := stream.readline(MAX_LINE):
            line = raw.decode("utf-8", "replace").rstrip("\n").translate(_UNSAFE)
            if tail is not None:
                tail.append(line)
            out.emit(prefix + line)


def _stop_reason(note: Path) -> str | None:
    """Why `stop` stopped this launch's ranks (its note), None when it did not."""
    try:
        return note.read_text().strip()[:200] or STOP_BY_OPERATOR
    except OSError:
        return None


def _supervise(children, out: _Output, timeout: float | None,
               tripped: threading.Event, target: Target, note: Path) -> int:
    """Wait for the ranks: 0 all ended well, 1 one failed (a `failed` event), 130 `stop`
    stopped them (a `stopped` event with its reason) or the controller went away."""
    deadline = time.monotonic() + timeout if timeout else None
    next_look = time.monotonic()
    while True:
        if time.monotonic() >= next_look:
            _revert_orphan(target)
            next_look = time.monotonic() + ORPHAN_LOOK_S
        if tripped.is_set():  # a watched link is down: the link-down event says which
            return 1
        if out.reader_left():  # the controller is gone: nobody supervises the ranks any more
            return EXIT_INTERRUPTED
        running = 0
        for c in children:
            rc = c.process.poll()
            if rc is None:
                running += 1
            elif rc != 0:
                c.drain()
                reason = _stop_reason(note)
                if reason is not None:  # `stop` ended it: not a failure of the job
                    out.emit(json.dumps({"event": "stopped", "rank": c.rank, "rc": rc,
                                         "reason": reason}))
                    return EXIT_INTERRUPTED
                out.emit(json.dumps({"event": "failed", "rank": c.rank, "rc": rc,
                                     "last": list(c.tail)}))
                return 1
        if not running:
            for c in children:
                c.drain()
            return 0
        if deadline and time.monotonic() > deadline:
            out.emit(json.dumps({"event": "failed", "rank": children[0].rank, "rc": None,
                                 "last": ["timed out"]}))
            return 1
        time.sleep(0.1)


def _revert_orphan(target: Target) -> None:
    """An apply left unconfirmed past its deadline whose watchdog is gone is reverted now: the
    launcher is a long-running agent process, as `watch` is (`apply.confirm.expired_orphan`).
    A state directory it cannot use does not stop the training: the next agent verb names it."""
    with contextlib.suppress(TopoError, OSError):
        expired_orphan(target, Store(target.store_dir, target=target))


def _stop_all(children: list[_Rank]) -> None:
    for c in children:
        if c.process.poll() is None:
            _killpg(c.process.pid, signal.SIGTERM)
    end = time.monotonic() + 5
    for c in children:
        try:
            c.process.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _killpg(c.process.pid, signal.SIGKILL)
            c.process.wait()


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def stop(run_dir: Path, reason: str = STOP_BY_OPERATOR) -> int:
    """Stop the ranks of a running `launch` on this host; the number of ranks signalled. Only
    processes that are still the ranks recorded (pid and start time) are signalled; a stale
    or unreadable pid file is reported on stderr and removed. The launch reports the ranks
    as `stopped` for `reason` (the note is left before any rank is signalled)."""
    pidfile = run_dir / "job.pids"
    try:
        entries = read_pids(pidfile)
    except PidFileError as e:
        print(f"topo-agent: ignoring and removing {e}", file=sys.stderr)
        pidfile.unlink(missing_ok=True)
        return 0
    pids = live(entries)
    if entries and not pids:
        print(f"topo-agent: the pid file {pidfile} is stale (its ranks are gone): removed",
              file=sys.stderr)
        pidfile.unlink(missing_ok=True)
    if pids:
        note = run_dir / STOP_NOTE
        tmp = note.with_name(f".{STOP_NOTE}.{os.getpid()}")
        tmp.write_text(reason.translate(_UNSAFE)[:200] + "\n")
        tmp.replace(note)
    for pid in pids:
        _killpg(pid, signal.SIGTERM)
    return len(pids)
