"""The agent's memory on disk: the history of applied states, newest last, and the host lock.

history/0000.json is the baseline: the values of every sysctl and link attribute the agent has
ever changed, as they were before it first changed them (and no addresses, routes, rules or
QoS). Each successful apply appends the desired state; rollback re-applies the one before the
newest and drops the newest. One directory per target, so many namespaces never collide.
Files are JSON (which is YAML too): a 1,000-route state writes and reads in milliseconds.

The state directory belongs to the agent: owned by its uid and 0700, every file 0600 (a state
names the host's addresses and routes). Nothing in it is followed through a symlink: the
directory and every file are opened with O_NOFOLLOW relative to the directory's descriptor, and
temporary files are created with O_EXCL. A directory owned by another uid, a symlink, a
read-only or full file system, a file that is not a regular file or not a valid record: one
StoreError naming the path (exit 1), before the host is touched.

Only the newest `keep` applied states stay (default 20, `--keep-history`), plus the baseline;
the baseline is written before an apply changes anything, so a crash cannot lose an original
value. Writes are atomic and fsynced (old or new file, never a torn one). How the history and
the journal stay in agreement across a crash: topoagent.apply.journal.

The lock: one per host (network namespace), not per state directory: every writer (apply,
rollback, recover, confirm, the confirmation watchdog, watch --repair) holds it from reading the
last applied state to committing the new one, whichever state directory it was given. It is a
flock on /run/topoagent/netns-<inode>.lock, the inode of the target's network namespace (the
same for `--netns NAME` and for an agent started inside NAME), taken with the state
directory's own `lock` (two targets given one directory do not interleave either)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from topoagent.protocol import TopoError
from topoagent.state.host import HostState, Interface, StateError, Sysctl, parse_host_state
from topoagent.target import NETNS_RUN_DIR, Target

DEFAULT_KEEP = 20
LOCK_DIR = Path("/run/topoagent")
MAX_FILE = 64 << 20  # bytes: a 1,000-route state is ~100 KB; more is not a record of ours
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StoreError(TopoError):
    """The state directory or a file in it cannot be used: owned by another uid, a symlink, a
    read-only or full file system, a malformed record. The message names the path."""


class StoreBusy(TopoError, RuntimeError):
    """Another topo-agent holds the host's lock (an apply or rollback is running)."""


# --- the state directory, opened safely ----------------------------------------------------------
def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "is a symlink (refused: the agent follows no symlinks in its state directory)"
    if e.errno == errno.ENOTDIR:
        return "is not a directory"
    return e.strerror or str(e)


def _checked_dir(fd: int, path: Path) -> int:
    """`fd` (a directory) after checking it is ours; tightened to 0700 when an older agent made
    it with the umask's 0755. Closes `fd` and raises StoreError otherwise."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise StoreError(f"{path}: owned by uid {st.st_uid}, not by the agent's uid "
                         f"{os.geteuid()}: refusing to use it (chown it, or pick another "
                         f"--state-dir)")
    if st.st_mode & 0o077:
        try:
            os.fchmod(fd, 0o700)
        except OSError as e:
            os.close(fd)
            raise StoreError(f"{path}: cannot make it 0700: {_why(e)}") from None
    return fd


def open_dir(path: Path, *, create: bool, parent: int | None = None) -> int | None:
    """A descriptor of directory `path` (relative to `parent`'s descriptor when given), checked
    by `_checked_dir`; made 0700 when missing and `create`, else None when missing."""
    name = path.name if parent is not None else str(path)
    try:
        if create:
            if parent is None:
                path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if create:
            raise StoreError(f"{path}: cannot create it") from None
        return None
    except OSError as e:
        raise StoreError(f"{path}: {_why(e)}") from None
    return _checked_dir(fd, path)


@contextlib.contextmanager
def opened(path: Path, *, create: bool) -> Iterator[int | None]:
    """`open_dir` as a context: the descriptor is closed afterwards."""
    fd = open_dir(path, create=create)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def read_file(dfd: int, name: str, path: Path) -> bytes | None:
    """The bytes of regular file `name` in directory `dfd` (its path `path` for messages),
    None when missing. Never follows a symlink, never blocks on a FIFO."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(f"{path}: {_why(e)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path}: not a regular file")
        if st.st_size > MAX_FILE:
            raise StoreError(f"{path}: {st.st_size} bytes, more than a record of the agent "
                             f"can be ({MAX_FILE})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_FILE + 1)
    except OSError as e:
        raise StoreError(f"{path}: cannot read it: {_why(e)}") from None
    finally:
        os.close(fd)


def parse_json(data: bytes, path: Path) -> object:
    """`data` (the bytes of file `path`) parsed as JSON; StoreError naming the file when it is
    not JSON (torn, binary, nested beyond reason)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise StoreError(f"{path}: not a valid JSON record ({type(e).__name__}: "
                         f"{str(e)[:80]}); check the host, then remove the file") from None


def _drop_stale_tmp(dfd: int, tmp: str, path: Path) -> None:
    """A temporary file a crash left behind goes; anything else under its name is refused."""
    try:
        st = os.stat(tmp, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path.parent / tmp}: not a regular file (a symlink?): refusing to "
                         "write through it")
    os.unlink(tmp, dir_fd=dfd)


def fsync_dir(dfd: int) -> None:
    """The directory's entries (a rename, an unlink) survive a power loss."""
    with contextlib.suppress(OSError):  # some file systems refuse fsync on a directory
        os.fsync(dfd)


def write_file(dfd: int, name: str, data: bytes, path: Path) -> None:
    """Replace `name` in directory `dfd` atomically (a crash leaves the old or the new file):
    a new temporary file (O_EXCL, O_NOFOLLOW, 0600), fsynced, renamed over `name`."""
    tmp = f".{name}.tmp"
    made = False
    try:
        _drop_stale_tmp(dfd, tmp, path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        made = True
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        made = False
        fsync_dir(dfd)
    except OSError as e:
        raise StoreError(f"{path}: cannot write it: {_why(e)}") from None
    finally:
        if made:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)


def remove_file(dfd: int, name: str, path: Path) -> None:
    """Unlink `name` (a symlink itself, never its target); missing is fine."""
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StoreError(f"{path}: cannot remove it: {_why(e)}") from None


def check_writable(dfd: int, path: Path) -> None:
    """StoreError when the directory's file system is mounted read-only."""
    if os.fstatvfs(dfd).f_flag & os.ST_RDONLY:
        raise StoreError(f"{path}: on a read-only file system: the agent cannot record what "
                         "it changes there")


# --- the host lock -------------------------------------------------------------------------------
def host_lock_path(target: Target | None) -> Path:
    """The lock file of the host (network namespace) `target` acts on (None: the namespace this
    process runs in)."""
    ns = NETNS_RUN_DIR / target.netns if target is not None and target.netns else None
    try:
        ino = os.stat(ns if ns is not None else "/proc/self/ns/net").st_ino
    except OSError as e:
        raise StoreError(f"{ns}: {_why(e)}") from None
    return LOCK_DIR / f"netns-{ino}.lock"


def _flock(dfd: int, name: str, path: Path, busy: str) -> int:
    """An exclusive flock on `name` in `dfd` (made 0600), not waiting: StoreBusy if held."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dfd)
    except OSError as e:
        raise StoreError(f"{path}: cannot open the lock: {_why(e)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreBusy(busy) from None
    return fd


def _entry(n: int) -> str:
    return f"{n:04d}.json"


RETIRED = ".json.dropped"  # an entry a rollback dropped (`Store.retire`)


def _retired(n: int) -> str:
    return f"{n:04d}{RETIRED}"


def _number(name: str) -> int | None:
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "json" and len(stem) == 4 and stem.isdigit() else None


def _text(state: HostState) -> bytes:
    return (json.dumps(state.to_dict()) + "\n").encode()  # no indent: the C encoder


class Store:
    """The history of applied states of one target, with the host's lock so one writer runs at
    a time."""

    def __init__(self, root: Path, keep: int = DEFAULT_KEEP, target: Target | None = None):
        self.root = Path(root)
        self.dir = self.root / "history"
        self.keep = max(2, keep)  # two: rollback needs the one before the newest
        self.target = target  # whose host lock to take (None: this process's namespace)

    # --- the lock --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The host's lock and this directory's, not waiting: StoreBusy when another agent
        holds either (a second writer fails at once instead of interleaving with the first).
        StoreError when the directory cannot be written (wrong owner, read-only, a symlink)."""
        busy = "another topo-agent is applying to this target (lock {})"
        host = host_lock_path(self.target)
        fds: list[int] = []
        try:
            with opened(LOCK_DIR, create=True) as ldir:
                assert ldir is not None
                fds.append(_flock(ldir, host.name, host, busy.format(host)))
            with opened(self.root, create=True) as root:
                assert root is not None
                check_writable(root, self.root)
                fds.append(_flock(root, "lock", self.root / "lock",
                                  busy.format(self.root / "lock")))
            yield
        finally:
            for fd in reversed(fds):
                os.close(fd)  # closing the last descriptor releases the flock

    def wait_idle(self, seconds: float, poll: float = 0.1) -> None:
        """Return once no other agent holds the lock (say an apply whose SSH session dropped,
        still running); StoreBusy after `seconds`."""
        end = time.monotonic() + seconds
        while True:
            try:
                with self.lock():
                    return
            except StoreBusy as e:
                if time.monotonic() >= end:
                    held = str(e).rpartition("(lock ")[2].rstrip(")")
                    raise StoreBusy(f"another topo-agent still holds {held} after "
                                    f"{seconds:g} s") from None
                time.sleep(poll)

    # --- reading ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _history(self, create: bool = False) -> Iterator[int | None]:
        """The history directory's descriptor (None when there is none and not `create`)."""
        with opened(self.root, create=create) as root:
            hfd = None if root is None else open_dir(self.dir, create=create, parent=root)
        try:
            yield hfd
        finally:
            if hfd is not None:
                os.close(hfd)

    def numbers(self) -> list[int]:
        """The history's entry numbers, oldest first (0: the baseline)."""
        with self._history() as hfd:
            if hfd is None:
                return []
            return sorted(n for n in map(_number, os.listdir(hfd)) if n is not None)

    def _load(self, n: int) -> HostState:
        path = self.dir / _entry(n)
        with self._history() as hfd:
            raw = read_file(hfd, _entry(n), path) if hfd is not None else None
        data = None if raw is None else parse_json(raw, path)
        if not isinstance(data, dict):
            raise StoreError(f"{path}: not a HostState record (a JSON object), got "
                             f"{type(data).__name__}; check the host, then remove the file")
        try:
            return parse_host_state(data, prefix="")
        except StateError as e:
            raise StoreError(f"{path}: not a valid HostState record: {e}") from None

    def newest(self) -> int:
        """The newest entry's number (0: only the baseline, -1: no history at all)."""
        return max(self.numbers(), default=-1)

    def baseline(self) -> HostState | None:
        """The host's original values of what applies changed (sysctls, link attributes), or
        None before the first apply."""
        nums = self.numbers()
        return self._load(nums[0]) if nums else None

    def last_applied(self) -> HostState | None:
        """The newest applied state, or None when nothing was applied."""
        nums = self.numbers()
        return self._load(nums[-1]) if len(nums) > 1 else None

    def previous(self) -> HostState | None:
        """The state a rollback returns to: the one applied before the newest, with the
        baseline's original values for every sysctl and link attribute it leaves unsaid (so a
        value first changed by the newest apply goes back too)."""
        nums = self.numbers()
        if len(nums) < 2:
            return None
        return with_baseline(self._load(nums[-2]), self._load(nums[0]))

    def history_len(self) -> int:
        """Number of history entries, the baseline included."""
        return len(self.numbers())

    # --- writing (under the lock) ----------------------------------------------------------------
    def _write(self, n: int, text: bytes) -> None:
        with self._history(create=True) as hfd:
            assert hfd is not None
            write_file(hfd, _entry(n), text, self.dir / _entry(n))

    def save_baseline(self, additions: HostState) -> None:
        """Merge the original values an apply is about to overwrite into the baseline (first
        seen wins), before the apply changes them."""
        nums = self.numbers()
        if nums and additions == HostState():
            return
        base = self._load(nums[0]) if nums else HostState()
        merged = merge_baseline(base, additions)
        if not nums or merged != base:
            self._write(0, _text(merged))

    def push(self, desired: HostState) -> int | None:
        """Append `desired` to the history (not again when it is the newest); returns the new
        entry's number, None when none was written. Pruning is separate (`prune`), after the
        apply committed: until then recovery drops every entry after the journal's `newest`."""
        nums = self.numbers()
        if not nums:
            self.save_baseline(HostState())
            nums = [0]
        text = _text(desired)
        if len(nums) > 1:
            with self._history() as hfd:
                assert hfd is not None
                same = read_file(hfd, _entry(nums[-1]), self.dir / _entry(nums[-1])) == text
            if same:
                return None  # re-applying the same state does not grow the history
        n = nums[-1] + 1 if len(nums) > 1 else 1
        self._write(n, text)
        return n

    def prune(self) -> list[str]:
        """Keep the baseline and the newest `keep` applied states. Housekeeping after a commit:
        an old entry that cannot be removed stays (the newest entries, which say what the host
        is, are right either way) and is returned as a warning instead of failing the apply."""
        try:
            self._remove(self.numbers()[1:-self.keep])
        except StoreError as e:
            return [f"old history entries not pruned: {e}"]
        return []

    def pop(self, n: int | None = None) -> None:
        """Drop entry `n` (default: the newest applied state; never the baseline)."""
        nums = self.numbers()
        if n is None:
            n = nums[-1] if len(nums) > 1 else 0
        if n > 0 and n in nums:
            self._remove([n])

    # A rollback drops the newest entry in two steps: before its commit line the entry is
    # renamed to NNNN.json.dropped (no longer an entry: `numbers` ignores it), and a rename
    # that fails (an immutable file, a read-only directory) fails the rollback before its
    # commit, so the host goes back and history and host still agree; after the commit the
    # renamed file is only garbage, and a failure to delete it is a warning.
    def retire(self, n: int) -> None:
        """Entry `n` stops being part of the history (renamed aside, see above); StoreError
        naming it when it cannot be."""
        with self._history() as hfd:
            if hfd is None or n <= 0:
                return
            try:
                os.rename(_entry(n), _retired(n), src_dir_fd=hfd, dst_dir_fd=hfd)
            except FileNotFoundError:
                return
            except OSError as e:
                raise StoreError(f"{self.dir / _entry(n)}: cannot drop it from the history: "
                                 f"{_why(e)}") from None
            fsync_dir(hfd)

    def unretire(self, newest: int) -> None:
        """Entries up to `newest` that an unfinished rollback renamed aside come back."""
        with self._history() as hfd:
            if hfd is None:
                return
            for n in self._retired(hfd):
                if 0 < n <= newest:
                    try:
                        os.rename(_retired(n), _entry(n), src_dir_fd=hfd, dst_dir_fd=hfd)
                    except OSError as e:
                        raise StoreError(f"{self.dir / _retired(n)}: cannot put it back into "
                                         f"the history: {_why(e)}") from None
            fsync_dir(hfd)

    def purge_retired(self) -> list[str]:
        """Delete the entries renamed aside; what could not be deleted, as warnings."""
        left = []
        with self._history() as hfd:
            for n in [] if hfd is None else self._retired(hfd):
                try:
                    remove_file(hfd, _retired(n), self.dir / _retired(n))
                except StoreError as e:
                    left.append(f"{e} (no longer part of the history: harmless)")
        return left

    @staticmethod
    def _retired(hfd: int) -> list[int]:
        return sorted(int(name[:4]) for name in os.listdir(hfd)
                      if len(name) == len(_retired(0)) and name.endswith(RETIRED)
                      and name[:4].isdigit())

    def truncate(self, newest: int) -> None:
        """Drop every entry after `newest` (what an interrupted apply wrote)."""
        self._remove([n for n in self.numbers() if n > max(newest, 0)])

    def _remove(self, nums: list[int]) -> None:
        if not nums:
            return
        with self._history() as hfd:
            assert hfd is not None
            for n in nums:
                remove_file(hfd, _entry(n), self.dir / _entry(n))
            fsync_dir(hfd)


def merge_baseline(base: HostState, add: HostState) -> HostState:
    """Keep the first-seen original value of each sysctl and link attribute."""
    links = {i.name: i for i in base.interfaces}
    for i in add.interfaces:
        old = links.get(i.name)
        links[i.name] = Interface(
            name=i.name,
            mtu=old.mtu if old and old.mtu is not None else i.mtu,
            up=old.up if old and old.up is not None else i.up,
        )
    rp = {**add.sysctl.rp_filter, **base.sysctl.rp_filter}

    def first(name: str):
        v = getattr(base.sysctl, name)
        return v if v is not None else getattr(add.sysctl, name)
    return HostState(interfaces=list(links.values()), sysctl=Sysctl(
        ip_forward=first("ip_forward"), rp_filter=rp,
        multipath_hash_policy=first("multipath_hash_policy"),
        ipv6_forwarding=first("ipv6_forwarding"),
        ipv6_multipath_hash_policy=first("ipv6_multipath_hash_policy")))


def with_baseline(state: HostState, base: HostState) -> HostState:
    """`state`, with the baseline's values for sysctls and link attributes it does not set."""
    ifaces = {i.name: i for i in state.interfaces}
    for b in base.interfaces:
        i = ifaces.get(b.name)
        if i is None:
            ifaces[b.name] = b
        else:
            ifaces[b.name] = i.model_copy(update={
                "mtu": i.mtu if i.mtu is not None else b.mtu,
                "up": i.up if i.up is not None else b.up})
    return state.model_copy(update={"interfaces": list(ifaces.values()),
                                    "sysctl": sysctl_with_baseline(state.sysctl, base.sysctl)})


def sysctl_with_baseline(sysctl: Sysctl, base: Sysctl, rp_filter: bool = True) -> Sysctl:
    """`sysctl`, with the baseline's value for each sysctl it does not set (`rp_filter` False:
    the per-interface ones stay as they are)."""
    def pick(name: str):
        v = getattr(sysctl, name)
        return v if v is not None else getattr(base, name)
    return Sysctl(ip_forward=pick("ip_forward"),
                  rp_filter={**base.rp_filter, **sysctl.rp_filter} if rp_filter
                  else dict(sysctl.rp_filter),
                  multipath_hash_policy=pick("multipath_hash_policy"),
                  ipv6_forwarding=pick("ipv6_forwarding"),
                  ipv6_multipath_hash_policy=pick("ipv6_multipath_hash_policy"))
