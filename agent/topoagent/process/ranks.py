"""Who a rank runs as and what it may touch (the trust model: docs/agent.md).

A plan's `job.command` is code its author chose; the launcher is root. Ranks therefore run as
an unprivileged user: the job's `user` (`topoctl run --user` or the plan's `job.user`), else
$TOPO_RANK_USER, else `nobody`; root only when the job names it, with a warning. The child
enters the host's network namespace and sets its hostname as root, then drops to that user
(no supplementary groups) before the command is executed.

A rank gets a directory of its own, owned by its user and outside the agent's state directory
(which only root may enter): `RANK_ROOT/<id of the state directory>`, holding the job spec
(0600) and the checkpoints. `python`/`python3` as the command means this installation's
interpreter; when the rank's user cannot run it (an interpreter under /root), the system's
python of the same version with this installation's import path."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pwd
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import topoagent
from topoagent.protocol import TopoError
from topoagent.target import usable_by_any_user

DEFAULT_USER = "nobody"
RANK_ROOT = Path("/run/topo-agent/ranks")  # root-owned: no other user can create entries
JOB_FILE = "job.json"


class RankError(TopoError, RuntimeError):
    """The ranks cannot be given their user or directory (unknown user, a squatted path)."""


@dataclass(frozen=True)
class RankUser:
    """The account a host's ranks run as."""

    name: str
    uid: int
    gid: int

    @property
    def is_root(self) -> bool:
        """Whether the ranks would run with root's powers."""
        return self.uid == 0

    def is_me(self) -> bool:
        """Whether this is the agent's own user (nothing to drop)."""
        return self.uid == os.geteuid()


def rank_user(name: str | None) -> RankUser:
    """The job's user (None: $TOPO_RANK_USER, else `nobody`); an agent that is not root can
    only run ranks as itself. RankError naming `job.user` when there is no such user."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid())
        return RankUser(me.pw_name, me.pw_uid, me.pw_gid)
    name = name or os.environ.get("TOPO_RANK_USER") or DEFAULT_USER
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise RankError(f"no user {name!r} on this host to run the ranks as", "job.user"
                        ) from None
    return RankUser(pw.pw_name, pw.pw_uid, pw.pw_gid)


def drop_privileges(user: RankUser) -> None:
    """In the child, after the root-only setup: become `user` for good."""
    if user.is_me():
        return
    os.setgroups([])
    os.setgid(user.gid)
    os.setuid(user.uid)


def rank_dir(store_dir: Path) -> Path:
    """The ranks' directory of the agent whose state directory is `store_dir`."""
    key = hashlib.sha256(os.path.abspath(store_dir).encode()).hexdigest()[:16]
    return RANK_ROOT / key


def _root_dir(path: Path, mode: int) -> None:
    """`path` as a root-owned directory (made when missing); RankError when something else is
    there (a symlink, another owner), so nothing is written through it."""
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise RankError(f"cannot make {path}: {e.strerror or e}", "job") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise RankError(f"{path} is not a directory of the agent's user: refusing to use it",
                        "job")
    os.chmod(path, mode)


def prepare_rank_dir(store_dir: Path, user: RankUser, fresh: bool) -> Path:
    """The ranks' directory, owned by `user`, 0700; emptied first when `fresh` (a run that does
    not resume must never see an earlier run's checkpoints)."""
    _root_dir(RANK_ROOT, 0o711)
    d = rank_dir(store_dir)
    if fresh:
        shutil.rmtree(d, ignore_errors=True)  # fd-based: symlinks inside are not followed
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise RankError(f"{d} is not a directory: refusing to use it", "job")
    os.chown(d, user.uid, user.gid)
    os.chmod(d, 0o700)
    return d


def write_job_spec(directory: Path, text: str, user: RankUser, name: str = JOB_FILE) -> Path:
    """The job spec (or another file `name` of the launch, e.g. the tree schedule) for the
    ranks: a new file (never through a link the rank user left there), 0600, owned by
    `user`."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                     dir_fd=dfd)
        with os.fdopen(fd, "w") as f:
            os.fchown(f.fileno(), user.uid, user.gid)
            f.write(text)
    finally:
        os.close(dfd)
    return directory / name


def remove_if_unused(directory: Path) -> None:
    """After a run: drop the directory unless it holds checkpoints a later run may resume."""
    ckpt = directory / "checkpoints"
    if not (ckpt.is_dir() and not ckpt.is_symlink() and any(ckpt.iterdir())):
        shutil.rmtree(directory, ignore_errors=True)


def python_for(user: RankUser, factory: str | None) -> tuple[str, dict[str, str]]:
    """(interpreter, extra environment) for a `python` command run as `user`: this one, or
    when `user` could not run it, $TOPO_RANK_PYTHON or the system's python of the same version
    given this installation's import path (its site-packages, the agent's packages and the
    package of the job's model factory)."""
    if user.is_me() or (usable_by_any_user(sys.executable) and usable_by_any_user(os.__file__)):
        return sys.executable, {}
    python = (os.environ.get("TOPO_RANK_PYTHON")
              or f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    base = str(Path(sys.base_prefix).resolve())
    paths = [str(Path(topoagent.__file__).resolve().parents[1])]
    paths += [p for p in sys.path if p and os.path.isdir(p)
              and ("site-packages" in p or not str(Path(p).resolve()).startswith(base))]
    top = (factory or "").partition(":")[0].partition(".")[0]
    try:  # where the factory's package lives (found, not imported)
        spec = importlib.util.find_spec(top) if top.isidentifier() else None
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:  # the factory's package
        paths.append(str(Path(next(iter(spec.submodule_search_locations))).parent))
    return python, {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
