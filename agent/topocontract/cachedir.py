"""A cache directory only its user can write, checked as the agent checks its state directory.

Inductor unpickles what it finds in its cache (compiled graphs, kernels): whoever can write the
cache directory runs code as whoever reads it. A rank's inductor cache defaults to
``/tmp/topoctl-inductor-<uid>``, a name anyone can create first in /tmp (issue 50 item 1: ranks
adopted such a directory made by another uid with mode 0777 and followed a symlinked lock file
in it). `private_dir` accepts a directory only when

- every ancestor is a directory owned by root or the user, not writable by group or others
  unless sticky (/tmp: others cannot rename or remove what is ours there), and a symlink among
  them is owned by root or the user;
- the directory itself is no symlink (opened with O_NOFOLLOW), is owned by the user, and is
  0700 (a directory of ours with a looser mode is tightened, as the agent does);

otherwise it says why and hands out a new private directory instead (``mkdtemp``: a random
name, 0700, made by this call; no cache from earlier runs). Files inside are opened relative to
the directory's descriptor with O_NOFOLLOW (`open_private`). Standard library only: imported by
the runtime inside ranks (no torch at import)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _ancestor_problem(path: Path, uid: int) -> str:
    """Why an ancestor of `path` lets someone else replace it ('' when none does)."""
    for parent in reversed(path.parents):
        try:
            lst = os.lstat(parent)
            st = os.stat(parent)
        except OSError as e:
            return f"{parent}: {e.strerror}"
        if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (0, uid):
            return f"{parent} is a symlink owned by uid {lst.st_uid}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{parent} is not a directory"
        if st.st_uid not in (0, uid):
            return f"{parent} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{parent} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def check_private(path: str | Path) -> str:
    """Why `path` cannot be a private cache directory of this user ('' when it can: then it
    exists, owned by this user, 0700). Creates it (0700) when missing and its ancestors are
    safe."""
    path, uid = Path(os.path.abspath(path)), os.geteuid()
    why = _ancestor_problem(path, uid)
    if why:
        return why
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot create it: {e.strerror}"
    try:
        fd = os.open(path, _DIR)
    except OSError as e:
        return ("it is a symlink" if e.errno == errno.ELOOP else
                "it is not a directory" if e.errno == errno.ENOTDIR else e.strerror or str(e))
    try:
        st = os.fstat(fd)
        if st.st_uid != uid:
            return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)  # ours, made with the umask's mode by an older release
    finally:
        os.close(fd)
    return ""


def private_dir(path: str | Path, prefix: str) -> tuple[str, str]:
    """(`path`, '') when it is a private directory of this user (`check_private`), else (a new
    private directory `prefix`* in the temporary directory, the warning saying why `path` was
    not used)."""
    why = check_private(path)
    if not why:
        return str(path), ""
    fresh = tempfile.mkdtemp(prefix=prefix)
    return fresh, (f"{path}: {why}: not used (whoever can write it could run code as this "
                   f"user); using the new private directory {fresh} instead")


def open_private(directory: str | Path, name: str) -> int:
    """A descriptor of file `name` in the private `directory` (created 0600), never through a
    symlink: a symlink or other non-regular file there is removed and a file made anew."""
    dfd = os.open(directory, _DIR)
    try:
        for _ in range(2):
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                             | os.O_NONBLOCK, 0o600, dir_fd=dfd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise
                _remove(name, dfd)
                continue
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
            _remove(name, dfd)
        raise OSError(errno.EEXIST, f"{directory}/{name}: cannot be made a regular file")
    finally:
        os.close(dfd)


def _remove(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except IsADirectoryError:
        os.rmdir(name, dir_fd=dfd)
