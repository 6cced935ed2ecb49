"""Where the agent acts: the host itself or one network namespace of it (the lab's hosts).

A Target opens the netlink socket and gives file access to /proc/sys/net as seen from inside
the namespace. It never creates a namespace: a missing one is an error, not a new empty host."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from topoagent.protocol import TopoError

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_SLAVE = 0x1000, 0x4000, 0x80000
NETNS_RUN_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")  # per-namespace /etc files, as `ip netns exec` uses them
SYSTEM_NSSWITCH = Path("/etc/nsswitch.conf")
DEFAULT_STATE_ROOT = Path("/var/lib/topo-agent")


class TargetError(TopoError, RuntimeError):
    """The target (a namespace, this host) cannot be used: missing, not root, nothing to
    roll back."""


@dataclass(frozen=True)
class Target:
    """Where the agent acts: this host or one of its network namespaces, with its state directory
    and ovsdb-server."""

    netns: str | None = None
    state_dir: Path | None = None  # where last-applied state is kept; default per target
    ovsdb: str | None = None  # ovsdb-server to use (default: $TOPO_OVSDB, else the system's)

    @property
    def ovs_db(self) -> str:
        """The ovsdb-server remote: --ovsdb, else $TOPO_OVSDB, else the system socket."""
        return self.ovsdb or os.environ.get("TOPO_OVSDB") or "unix:/run/openvswitch/db.sock"

    def check(self) -> None:
        """TargetError when the named namespace does not exist."""
        if self.netns is not None and not (NETNS_RUN_DIR / self.netns).exists():
            raise TargetError(f"no such network namespace: {self.netns}")

    @property
    def store_dir(self) -> Path:
        """Where this target's applied states live. An agent started inside a named namespace
        (say over SSH into a lab host) finds the same directory as `--netns NAME` would."""
        if self.state_dir is not None:
            return self.state_dir
        netns = self.netns or current_netns_name()
        return DEFAULT_STATE_ROOT / (f"netns-{netns}" if netns else "host")

    def iproute(self):
        """A pyroute2 IPRoute in the target (imported here: read-only paths never need it)."""
        from pyroute2 import IPRoute, config

        # pyroute2 forks a helper to open the socket inside the namespace and ends it with
        # SIGTERM: the helper resets SIGTERM to its default first instead of running ours
        # (topoagent.signals)
        config.disable_mp_signal = True
        self.check()
        return IPRoute(netns=self.netns) if self.netns else IPRoute()

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Run the body with this thread in the target's network namespace (for /proc/sys/net
        and sockets); back in the original namespace afterwards, also on error."""
        if self.netns is None:
            yield
            return
        self.check()
        libc = ctypes.CDLL(None, use_errno=True)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            fd = os.open(NETNS_RUN_DIR / self.netns, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise TargetError(f"cannot enter netns {self.netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            try:
                yield
            finally:
                if libc.setns(home, CLONE_NEWNET) != 0:  # pragma: no cover - fatal
                    raise TargetError("cannot return to the original network namespace")
        finally:
            os.close(home)

    def enter(self) -> None:
        """Move this process into the target's namespace for good (a child's preexec_fn)."""
        if self.netns is None:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(NETNS_RUN_DIR / self.netns, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise TargetError(f"cannot enter netns {self.netns}")
        finally:
            os.close(fd)
        _use_netns_etc(libc, NETNS_ETC_DIR / self.netns)

    def read_sysctl(self, path: str) -> str | None:
        """A /proc/sys/net value as seen in the target (None when absent)."""
        with self.inside():
            try:
                return Path("/proc/sys", path).read_text().strip()
            except FileNotFoundError:
                return None

    def write_sysctl(self, path: str, value: str) -> None:
        """Write a /proc/sys/net value in the target."""
        with self.inside():
            Path("/proc/sys", path).write_text(value)


def current_netns_name() -> str | None:
    """The name under /run/netns of the namespace this process runs in (None: unnamed, such
    as the machine's own)."""
    try:
        mine = os.stat("/proc/self/ns/net").st_ino
        for entry in os.scandir(NETNS_RUN_DIR):
            if os.stat(entry.path).st_ino == mine:
                return entry.name
    except OSError:
        pass
    return None


def _use_netns_etc(libc: ctypes.CDLL, etc: Path) -> None:
    """Put the namespace's own /etc files (`/etc/netns/NAME/FILE`, e.g. the lab's
    nsswitch.conf) in place of /etc/FILE for this process, in a mount namespace of its own, as
    `ip netns exec` does: a process entering by setns would otherwise resolve names as the
    machine does (the lab's hosts cannot reach its DNS server). Best effort: a process that
    cannot have a mount namespace of its own (threads already running) keeps the machine's."""
    if not etc.is_dir():
        return
    if libc.unshare(CLONE_NEWNS) != 0:
        return
    # mounts made here must not propagate back to the machine's mount namespace
    if libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
        return
    for src in sorted(etc.iterdir()):
        dst = Path("/etc") / src.name
        if src.is_file() and dst.exists():
            libc.mount(bytes(src), bytes(dst), b"none", MS_BIND, None)


def files_only_nsswitch(nsswitch: str) -> str:
    """`nsswitch` (an nsswitch.conf) with host names looked up in files only (/etc/hosts).

    A namespace with no route to the machine's DNS server (a lab host, a scratch namespace)
    fails a lookup /etc/hosts does not answer with EAI_AGAIN ("try again") rather than "no
    such name": every reverse lookup of a training address did, and c10d, which names its
    store sockets' addresses with getnameinfo, printed "The hostname of the client socket
    cannot be retrieved. err=-3" once per rank. With files only, an address without a name
    is given back as digits, as on a host whose DNS answers."""
    lines = [ln for ln in nsswitch.splitlines() if not ln.strip().startswith("hosts:")]
    return "\n".join([*lines, "hosts:          files"]) + "\n"


def give_files_only_names(netns: str, etc: Path = NETNS_ETC_DIR) -> None:
    """Give namespace `netns` its own nsswitch.conf (`files_only_nsswitch`) under
    `etc`/<netns>/, which `ip netns exec` and `Target.enter` put over /etc/nsswitch.conf;
    nothing when this machine has no /etc/nsswitch.conf (glibc's defaults then apply)."""
    if not SYSTEM_NSSWITCH.is_file():
        return
    d = etc / netns
    d.mkdir(parents=True, exist_ok=True)
    (d / "nsswitch.conf").write_text(files_only_nsswitch(SYSTEM_NSSWITCH.read_text()))


def drop_netns_etc(pattern: str, etc: Path = NETNS_ETC_DIR) -> None:
    """Remove the per-namespace /etc files of the namespaces matching `pattern` (a glob), and
    `etc` itself when nothing else keeps files there."""
    for d in etc.glob(pattern):
        shutil.rmtree(d, ignore_errors=True)
    try:
        etc.rmdir()
    except OSError:
        pass


def usable_by_any_user(path: str | Path) -> bool:
    """Every directory on the way to `path` searchable by any user, and `path` itself readable
    and (for a program) executable by any user: what another user needs to run it (a pyenv
    under /root is not)."""
    real = Path(path).resolve()
    try:
        if real.stat().st_mode & 0o005 != 0o005:
            return False
        return all(d.stat().st_mode & 0o001 for d in real.parents)
    except OSError:
        return False
