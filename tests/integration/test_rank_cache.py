"""A rank's inductor cache lives only where its user alone can write (issue 50 item 1): ranks
adopted /tmp/topoctl-inductor-<uid> whoever created it (another uid, mode 0777) and followed a
symlinked lock file in it; inductor unpickles its cache from there, so whoever made the folder
ran code as the rank's user. Real directories, a real other uid (nobody), real symlinks, and
the runtime's real `apply_fusion` with dynamo (its `eager` backend: the cache decision and the
lock are the runtime's, the compile is not what is under test). Every way another user can
hold the path is a case: its owner, its mode, a symlink at the path or in it, an ancestor
writable by others, a file in its place."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from topocontract.cachedir import check_private, open_private, private_dir
from topocontract.fusion import FusionPlan, inductor_cache_dir

pytestmark = pytest.mark.netns  # root: chown to another uid

OTHER = 65534  # nobody


@pytest.fixture
def tmpdir_like(tmp_path, monkeypatch) -> Path:
    """A /tmp of our own: root's, 1777, as TMPDIR (where the default cache name lives)."""
    base = tmp_path / "tmp"
    base.mkdir()
    os.chmod(base, 0o1777)
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("TOPOCTL_INDUCTOR_CACHE", raising=False)
    import tempfile

    from topotrain import events
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.setattr(events, "_channel", None)  # the event line goes to this test's stdout
    return base


def _squat(path: Path, how: str, victim: Path) -> None:
    """Another user (or someone else's doing) holds `path` as `how`."""
    if how == "other uid, 0777":
        path.mkdir(mode=0o777)
        os.chmod(path, 0o777)
        os.chown(path, OTHER, OTHER)
    elif how == "other uid, 0700":
        path.mkdir(mode=0o700)
        os.chown(path, OTHER, OTHER)
    elif how == "symlink to another's dir":
        target = path.parent / "elsewhere"
        target.mkdir(mode=0o777)
        os.chown(target, OTHER, OTHER)
        path.symlink_to(target)
        os.lchown(path, OTHER, OTHER)
    elif how == "symlink to our own dir":
        target = path.parent / "ours"
        target.mkdir(mode=0o700)
        path.symlink_to(target)
    elif how == "a file":
        path.write_text("x")
        os.chown(path, OTHER, OTHER)
    elif how == "other uid, symlinked lock":
        path.mkdir(mode=0o777)
        os.chmod(path, 0o777)
        (path / "topotrain-compile.lock").symlink_to(victim)
        os.chown(path, OTHER, OTHER)


SQUATS = ["other uid, 0777", "other uid, 0700", "symlink to another's dir",
          "symlink to our own dir", "a file", "other uid, symlinked lock"]


@pytest.mark.parametrize("how", SQUATS)
def test_a_squatted_default_cache_is_never_used(tmpdir_like, tmp_path, how, capfd):
    torch = pytest.importorskip("torch")
    from topotrain.fusion import apply_fusion

    default = Path(inductor_cache_dir())
    assert default.parent == tmpdir_like
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    _squat(default, how, victim)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    report = apply_fusion(model, FusionPlan("groups", ("0",)), [torch.randn(2, 4)], rank=3,
                          backend="eager")
    used = Path(report.cache_dir)
    assert used != default and used.parent == tmpdir_like
    st = os.lstat(used)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(used)
    assert victim.read_text() == "untouched"
    err = capfd.readouterr().err
    assert f"inductor cache {default}:" in err and "not used" in err, err


def test_our_own_cache_is_used_and_tightened(tmpdir_like, capfd):
    torch = pytest.importorskip("torch")
    from topotrain.fusion import apply_fusion

    default = Path(inductor_cache_dir())
    default.mkdir(mode=0o755)
    os.chmod(default, 0o755)  # made by an older release with the umask's mode
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    report = apply_fusion(model, FusionPlan("groups", ("0",)), [torch.randn(2, 4)], rank=0,
                          backend="eager")
    assert report.cache_dir == str(default)
    assert stat.S_IMODE(os.stat(default).st_mode) == 0o700
    assert stat.S_ISREG(os.lstat(default / "topotrain-compile.lock").st_mode)
    assert "inductor cache" not in capfd.readouterr().err


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_an_ancestor_others_can_write_is_refused(tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)  # no sticky bit: anyone may rename our directory away
    why = check_private(shared / "cache")
    assert f"{shared} is writable by others" in why
    used, warning = private_dir(shared / "cache", "tpt-cache-")
    assert used != str(shared / "cache") and str(shared / "cache") in warning
    os.rmdir(used)


def test_an_ancestor_owned_by_another_uid_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER, OTHER)
    assert f"{theirs} is owned by uid {OTHER}" in check_private(theirs / "cache")


def test_a_symlinked_file_inside_is_replaced_not_followed(tmp_path):
    d = tmp_path / "cache"
    assert check_private(d) == ""
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (d / "lock").symlink_to(victim)
    fd = open_private(d, "lock")
    os.write(fd, b"mine")
    os.close(fd)
    assert victim.read_text() == "untouched"
    assert stat.S_ISREG(os.lstat(d / "lock").st_mode)
