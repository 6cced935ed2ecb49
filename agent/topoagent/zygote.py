"""`topo-agent` calls without an interpreter's start-up each: a fork server (a "zygote").

Why: a lab's `topoctl apply/diff/status/run/recover` starts one `python -m topoagent.cli` per
host and verb; a full test run started ~1,100 of them at ~0.4 CPU-s each on the 2-core VM, of
which ~0.3 CPU-s is the interpreter's start and the imports (the agent's modules 0.18 s,
pydantic and yaml 0.09 s): ~7 of the suite's 33 CPU-minutes.

The zygote (`python -m topoagent.zygote`, started by `Zygote` on first use) imports the agent
once and then forks one child per call. Each child is a real process of its own that runs
`topoagent.cli.main(argv)`, the function `python -m topoagent.cli` runs, with the caller's
argv, environment, working directory, stdin, stdout and stderr (the caller's own file
descriptors, passed over a Unix socket with SCM_RIGHTS: output arrives as it is written), and
ends as that interpreter would (atexit, threads joined, streams flushed; the teardown of
every object it inherited skipped: it would copy the whole heap); /proc/PID/cmdline
and `ps` show it as `python -m topoagent.cli ARGS`. The caller gets its
pid and a pidfd to signal it (a timeout's SIGKILL, a `close`'s SIGTERM: race-free, the pid
cannot be reused while the zygote has not reaped it) and its exit code as `subprocess` reports
it (negative for a signal).

Safety: the zygote is single-threaded, always (it checks before every fork: forking a
threaded process is unsafe); it waits for requests, children's exits (their pidfds) and its
parent's exit in one `selectors` loop. It serves calls concurrently: each request carries its
own reply socket, on which the pid and later the exit code come back, so callers in several
threads never share a reply. It ends when its control socket reaches EOF (`Zygote.close`, or
the caller's death closing its end) or its parent exits (a pidfd on the parent: prctl's
PR_SET_PDEATHSIG would fire when the *thread* that started it ends, and the rollout starts it
from a worker thread), after reaping the children it still has.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import io
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

MAX_REQUEST = 1 << 20  # argv + environment of one call, as JSON
READY_TIMEOUT = 60.0  # the imports on a loaded 2-core machine take 2 s; far beyond that: broken
REPLY_TIMEOUT = 30.0  # a fork's answer (its pid) on a loaded machine
TITLE_ROOM = 4096  # bytes of the server's command line a child rewrites as the agent's own


class ZygoteError(OSError):
    """The fork server cannot start, or ended before it reported a child's exit."""


# --- the server ----------------------------------------------------------------------------


@dataclass
class Request:
    """One call: the agent's argv, the child's whole environment and working directory, and
    its stdin, stdout and stderr (file descriptors received from the caller)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    fds: list[int] = field(default_factory=list)  # stdin, stdout, stderr


def _preload() -> None:
    """Import what the verbs import, also late (what a child imports costs it each time). Not
    pyroute2 nor the OVS library, which few calls use: a larger server costs every fork more
    (show and apply in a namespace: 0.04-0.05 CPU-s a call without them, 0.05-0.065 with)."""
    import topoagent.cli  # noqa: F401  # the server's purpose: imported once, before any fork
    import topoagent.drivers.netlink  # noqa: F401  # apply and recovery import it late


class _Server:
    """The zygote's state: control socket, parent's pidfd, children (pidfd -> pid, reply)."""

    def __init__(self, control: socket.socket, parent: int):
        self.control = control
        self.parent = os.pidfd_open(parent)
        self.sel = selectors.DefaultSelector()
        self.sel.register(control, selectors.EVENT_READ, "control")
        self.sel.register(self.parent, selectors.EVENT_READ, "parent")
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply)
        self.accepting = True

    def loop(self) -> Request | None:
        """Serve until EOF and no child left (None); in a forked child, its request."""
        while self.accepting or self.children:
            for key, _ in self.sel.select():
                if key.data == "control":
                    req = self.on_request()
                    if req is not None:
                        return req  # this is the child now
                elif key.data == "parent":
                    self.stop_accepting()
                else:
                    self.on_exit(key.fd)
        return None

    def stop_accepting(self) -> None:
        for f in (self.control, self.parent):
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(f)
        self.accepting = False

    def on_request(self) -> Request | None:
        """Receive one request and fork its child; the request in the child, None here."""
        try:
            msg, fds, flags, _ = socket.recv_fds(self.control, MAX_REQUEST, 5)
        except OSError:
            msg, fds, flags = b"", [], 0
        if not msg:
            self.stop_accepting()  # the caller closed its end, or died
            return None
        reply = socket.socket(fileno=fds[0]) if fds else None
        try:
            if reply is None or len(fds) != 4 or flags & socket.MSG_TRUNC:
                raise ZygoteError("malformed request")
            d = json.loads(msg)
            req = Request(list(d["argv"]), dict(d["env"]), d.get("cwd"), fds[1:])
            if threading.active_count() != 1:  # never fork a threaded process
                raise ZygoteError("the fork server has threads")
            pid = os.fork()
        except (OSError, ValueError, KeyError, TypeError) as e:
            for fd in fds[1:]:
                os.close(fd)
            if reply is not None:
                with contextlib.suppress(OSError):
                    reply.send(json.dumps({"error": str(e)}).encode())
                reply.close()
            return None
        if pid == 0:
            self.leave(reply)
            return req
        for fd in req.fds:
            os.close(fd)
        self.started(pid, reply)
        return None

    def started(self, pid: int, reply: socket.socket) -> None:
        """Tell the caller the child's pid (with a pidfd of its own) and watch for its exit."""
        pidfd = os.pidfd_open(pid)
        with contextlib.suppress(OSError):  # a caller gone: the child is still reaped
            socket.send_fds(reply, [json.dumps({"pid": pid}).encode()], [pidfd])
        self.children[pidfd] = (pid, reply)
        self.sel.register(pidfd, selectors.EVENT_READ, "child")

    def on_exit(self, pidfd: int) -> None:
        """Reap an ended child and report its exit code as `subprocess` gives it."""
        pid, reply = self.children.pop(pidfd)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            reply.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
        reply.close()

    def leave(self, reply: socket.socket) -> None:
        """In a new child: close every descriptor of the server (other calls' replies above
        all: a child holding one would keep its caller waiting), through their owners."""
        reply.close()
        for pidfd, (_, other) in self.children.items():
            other.close()
            os.close(pidfd)
        self.children.clear()
        self.sel.close()
        self.control.close()
        os.close(self.parent)


def _stdio(fd: int, mode: str, env: dict[str, str]) -> io.TextIOWrapper:
    """A standard stream as a new interpreter makes it (line-buffered on a terminal, stderr
    always; PYTHONUNBUFFERED honoured)."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    binary = open(fd, mode + "b", buffering=0 if unbuffered and mode == "w" else -1,  # noqa: SIM115
                  closefd=False)
    return io.TextIOWrapper(binary, encoding=sys.stdout.encoding or "utf-8",
                            errors="backslashreplace" if fd == 2 else "strict",
                            line_buffering=mode == "w" and (fd == 2 or os.isatty(fd)),
                            write_through=unbuffered)


def _retitle(argv: list[str]) -> None:
    """Show `argv` as this process's command line (/proc/PID/cmdline, `ps`), written over the
    server's own argv, which its last argument pads (TITLE_ROOM); what does not fit is cut.
    setproctitle's way: prctl(PR_SET_MM_ARG_START) would need CAP_SYS_RESOURCE. The C argv is
    the kernel's copy only: Python copied it at start-up."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        start, end = int(fields[45]), int(fields[46])  # (48) arg_start, (49) arg_end
        data = b"".join(a.encode() + b"\0" for a in argv)[:end - start - 1]
        ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def child(req: Request) -> int:
    """Become the call's `python -m topoagent.cli`: its descriptors, environment, directory,
    default SIGINT; run the agent's main; its exit code (SystemExit passes through)."""
    import topoagent.cli as cli  # noqa: PLC0415  # loaded by _preload before the fork

    _retitle([sys.executable, "-m", "topoagent.cli", *req.argv])  # as a process of its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(req.fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(req.env)
    if req.cwd:
        os.chdir(req.cwd)
    sys.stdin = sys.__stdin__ = _stdio(0, "r", req.env)
    sys.stdout = sys.__stdout__ = _stdio(1, "w", req.env)
    sys.stderr = sys.__stderr__ = _stdio(2, "w", req.env)
    sys.argv = [cli.__file__, *req.argv]
    return cli.main(req.argv)


def serve(control_fd: int, parent: int) -> int:
    """The zygote's main: import, report ready, serve; its exit code. Each forked child runs
    the agent and never returns."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's ^C is for the calls
    control = socket.socket(fileno=control_fd)
    _preload()
    gc.freeze()  # as the agent's own __main__: the imports' objects are never walked again
    if os.getppid() != parent or threading.active_count() != 1:
        return 1
    control.send(json.dumps({"ready": os.getpid()}).encode())
    req = _Server(control, parent).loop()
    if req is None:
        return 0
    _exit_as_python(req)


def _exit_as_python(req: Request) -> NoReturn:
    """Run the child and end it as the interpreter ends, but for the teardown of every module
    and object: that frees each object of the server's heap, so the child copies every page of
    it first (0.02-0.03 CPU-s a call, a third of a forked call). An exception leaves as the
    interpreter reports it; non-daemon threads are joined, atexit functions run, the standard
    streams flushed."""
    try:
        code = child(req)
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:  # as the interpreter does: die of SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:  # noqa: BLE001 - an uncaught exception: traceback, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is not main and not t.daemon:
            t.join()
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is not None:
        run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit((code or 0) & 0xFF)


# --- the client ----------------------------------------------------------------------------


class Child:
    """One forked agent, as much of `subprocess.Popen` as the callers use: pid, poll, wait,
    send_signal, terminate, kill, returncode."""

    def __init__(self, pid: int, pidfd: int, reply: socket.socket):
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._reply = reply
        self._lost = False  # the server ended without reporting the exit
        self._wait = threading.Lock()
        self._sig = threading.Lock()  # the pidfd is closed under it, never while signalling

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; subprocess.TimeoutExpired when it runs past `timeout` seconds,
        ZygoteError when the server ended without reporting it."""
        if not self._wait.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise subprocess.TimeoutExpired(["topo-agent"], timeout or 0)
        try:
            if self.returncode is None and not self._lost:
                self._reply.settimeout(timeout)
                try:
                    msg = self._reply.recv(4096)
                except (TimeoutError, BlockingIOError):
                    raise subprocess.TimeoutExpired(["topo-agent"], timeout or 0) from None
                except OSError:
                    msg = b""
                self._finish(json.loads(msg)["exit"] if msg else None)
            if self.returncode is None:
                raise ZygoteError(f"the agent fork server ended before agent {self.pid} did")
            return self.returncode
        finally:
            self._wait.release()

    def _finish(self, code: int | None) -> None:
        with self._sig:
            os.close(self._pidfd)
            self._pidfd = -1
        self._reply.close()
        self.returncode = code
        self._lost = code is None

    def poll(self) -> int | None:
        """Its exit code if it has ended, else None."""
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        """Signal it (nothing once it has been reaped)."""
        with self._sig:
            if self._pidfd >= 0:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        """SIGTERM (the launcher then stops its ranks)."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


def _write_memfd(data: bytes) -> int:
    """A stdin that needs no writer: the bytes in an anonymous file, at offset 0."""
    fd = os.memfd_create("topo-agent-stdin", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _text(data: bytes) -> str:
    """Bytes as `subprocess`'s text mode decodes them (locale encoding, universal newlines)."""
    s = data.decode(locale.getpreferredencoding(False), errors="replace")
    return s.replace("\r\n", "\n").replace("\r", "\n")


def _read_all(fds: list[int], deadline: float | None) -> tuple[list[bytes], bool]:
    """Everything written to each pipe until all reach EOF (True) or the deadline (False)."""
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return [b"".join(chunks[fd]) for fd in fds], False
            for key, _ in sel.select(left):
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
    return [b"".join(chunks[fd]) for fd in fds], True


class Zygote:
    """A client of one fork server, started on first use; thread-safe."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self._start = threading.Lock()
        self._send = threading.Lock()
        self._control: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._closed = False
        self.error: str | None = None  # why it could not start

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs (None before its first call and after close)."""
        return self._proc.pid if self._proc is not None and self._control is not None else None

    def available(self) -> bool:
        """Start the server unless it runs already; False when it cannot (or is closed)."""
        return self._running() is not None

    def _running(self) -> socket.socket | None:
        """The control socket of the running server, started now if need be."""
        with self._start:
            if self._control is None and not self._closed and self.error is None:
                try:
                    self._launch()
                except (OSError, ValueError) as e:
                    self.error = str(e)
            return self._control if self.error is None else None

    def _launch(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen([self.python, "-m", "topoagent.zygote", str(theirs.fileno()),
                                     str(os.getpid()), " " * TITLE_ROOM],
                                    pass_fds=[theirs.fileno()],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            theirs.close()
        mine.settimeout(READY_TIMEOUT)
        try:
            ready = mine.recv(4096)
        except OSError:
            ready = b""
        if not ready:
            mine.close()
            proc.kill()
            proc.wait()
            raise ZygoteError(f"the agent fork server did not start (exit {proc.returncode})")
        mine.settimeout(REPLY_TIMEOUT)
        self._control, self._proc = mine, proc
        # a client never closed (a transport dropped without close) still ends its server
        weakref.finalize(self, _shut, mine)

    def spawn(self, argv: list[str], env: dict[str, str], stdin: bytes,
              stdout: int, stderr: int, cwd: str | None = None) -> Child:
        """Fork `topoagent.cli.main(argv)` with this environment and these descriptors (the
        caller keeps and closes its own); ZygoteError when the server cannot."""
        control = self._running()  # held here: a `close` in another thread drops the field
        if control is None:
            raise ZygoteError(self.error or "the agent fork server is closed")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        memfd = _write_memfd(stdin)
        try:
            msg = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
            with self._send:
                socket.send_fds(control, [msg], [theirs.fileno(), memfd, stdout, stderr])
        except OSError as e:
            mine.close()
            self.error = f"the agent fork server is gone: {e}"
            raise ZygoteError(self.error) from e
        finally:
            theirs.close()
            os.close(memfd)
        mine.settimeout(REPLY_TIMEOUT)
        try:
            msg, fds, _, _ = socket.recv_fds(mine, 4096, 1)
            answer = json.loads(msg) if msg else {"error": "the agent fork server ended"}
        except (OSError, ValueError) as e:
            answer = {"error": str(e)}
        if "pid" not in answer or not fds:
            mine.close()
            raise ZygoteError(f"cannot fork the agent: {answer.get('error')}")
        return Child(answer["pid"], fds[0], mine)

    def run(self, argv: list[str], stdin: str | None = None, env: dict[str, str] | None = None,
            timeout: float | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
        """`subprocess.run([python, -m, topoagent.cli, *argv], input=stdin, env=env,
        capture_output=True, text=True, timeout=timeout)`: the child killed and TimeoutExpired
        raised past `timeout`, as there."""
        env = dict(os.environ) if env is None else env
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            try:
                proc = self.spawn(argv, env, (stdin or "").encode(), out_w, err_w, cwd)
            finally:
                os.close(out_w)
                os.close(err_w)
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                (out, err), done = _read_all([out_r, err_r], deadline)
                if done:
                    rc = proc.wait(None if deadline is None
                                   else max(0.0, deadline - time.monotonic()))
                else:
                    raise subprocess.TimeoutExpired(argv, timeout or 0)
            except BaseException:  # a timeout, ^C: the child does not outlive the call
                proc.kill()
                with contextlib.suppress(ZygoteError):
                    proc.wait()
                raise
        finally:
            os.close(out_r)
            os.close(err_r)
        return subprocess.CompletedProcess(["topo-agent", *argv], rc, _text(out), _text(err))

    def close(self, timeout: float = 10.0) -> None:
        """End the server: it stops taking calls, reports the ones still running and exits.
        Calls after this raise ZygoteError."""
        with self._start:
            self._closed = True
            control, proc, self._control = self._control, self._proc, None
        if control is None or proc is None:
            return
        _shut(control)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:  # children of calls still running keep it alive
            pass


def _shut(control: socket.socket) -> None:
    """EOF for the server however many processes share the socket (a fork of the caller)."""
    with contextlib.suppress(OSError):
        control.shutdown(socket.SHUT_RDWR)
    control.close()


def stream_lines(fd: int) -> io.TextIOWrapper:
    """The read end of a child's merged output as text lines, as `Popen(text=True)` gives."""
    return open(fd, encoding=locale.getpreferredencoding(False), errors="replace")  # noqa: SIM115


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), int(sys.argv[2])))
