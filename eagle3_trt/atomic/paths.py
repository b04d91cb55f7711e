"""Where the atomic writer's entries live and how it puts a finished tree in place: names of the
staging and lock entries beside a destination, modes, fsync, ``mkdir -p`` at 0755, the atomic swap."""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.procs import pid_alive

DIR_MODE = 0o755
FILE_MODE = 0o644
EXEC_MODE = 0o755
_STAGING = ".tmp-"
_OLD = ".old-"
_LOCK = ".lock"


def staging_prefix(dest: Path) -> str:
    """Name prefix of the staging entries of ``dest``: ``.NAME.tmp-<pid>-``."""
    return f".{Path(dest).name}{_STAGING}"


def lock_path(dest: Path) -> Path:
    """The advisory lock file of ``dest``: ``.NAME.lock`` in the same parent directory."""
    dest = Path(dest)
    return dest.parent / f".{dest.name}{_LOCK}"


def remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def remove_stale_staging(dest: Path) -> list[Path]:
    """Delete staging entries of ``dest`` (``.NAME.tmp-<pid>-*``, ``.NAME.old-<pid>-*``) whose writer is gone.

    The pid in the name tells whether the writer still runs; a live writer's entries and this
    process's own are kept."""
    dest = Path(dest)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(dest.parent))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    prefixes = [f".{dest.name}{m}" for m in (_STAGING, _OLD)]
    for e in entries:
        for prefix in prefixes:
            if not e.name.startswith(prefix):
                continue
            pid = e.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                p = Path(e.path)
                remove(p)
                removed.append(p)
    return removed


def _walk(root: Path) -> Iterator[tuple[Path, bool]]:
    """(path, is_dir) for root and everything under it; symlinks and special files are skipped
    (``os.chmod`` would follow a link and change the mode of whatever it points to)."""
    st = os.lstat(root)
    if stat.S_ISDIR(st.st_mode):
        for d, dirs, files in os.walk(root):  # followlinks=False: never leaves the tree
            for n in dirs + files:
                p = Path(d, n)
                m = os.lstat(p).st_mode
                if stat.S_ISDIR(m) or stat.S_ISREG(m):
                    yield p, stat.S_ISDIR(m)
        yield Path(root), True
    elif stat.S_ISREG(st.st_mode):
        yield Path(root), False


def fix_modes(root: Path) -> None:
    """0755 for every directory, 0644 for every regular file (0755 where the owner may execute it)."""
    for p, is_dir in _walk(Path(root)):
        if is_dir:
            os.chmod(p, DIR_MODE)
        else:
            os.chmod(p, EXEC_MODE if os.lstat(p).st_mode & stat.S_IXUSR else FILE_MODE)


def _fsync(p: Path, is_dir: bool) -> None:
    fd = os.open(p, os.O_RDONLY | (os.O_DIRECTORY if is_dir else 0))
    try:
        os.fsync(fd)
    except OSError as e:
        # Some filesystems cannot fsync a directory (EINVAL/EBADF); that is not a failed write.
        # Any other error (ENOSPC, EDQUOT, EIO surfacing at fsync) means the data is not on disk.
        if not (is_dir and e.errno in (errno.EINVAL, errno.EBADF, errno.ENOTSUP)):
            raise
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    for p, is_dir in _walk(root):  # files first, the root directory last
        _fsync(p, is_dir)


def fsync_dir(d: Path) -> None:
    """After a rename: best effort, the rename itself has happened."""
    try:
        _fsync(d, True)
    except OSError:
        pass


def make_dirs(d: Path) -> Path:
    """``mkdir -p`` whose new directories are 0755 whatever the umask; existing ones are not touched.

    For directories that are not written as a whole (a server's state directory); returns ``d``."""
    missing = []
    p = Path(d)
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir()
        except FileExistsError:
            continue
        except NotADirectoryError:
            break
        os.chmod(p, DIR_MODE)
    if not Path(d).is_dir():
        raise UserError(d, "is not a directory", "pass an output path whose parent is a directory")
    return Path(d)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100  # linux/fcntl.h
_libc_renameat2: Any = None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    global _libc_renameat2
    if _libc_renameat2 is None:
        try:
            _libc_renameat2 = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
        except (AttributeError, OSError):
            _libc_renameat2 = False
    if not _libc_renameat2:
        return False
    # Any failure (old kernel, a filesystem without RENAME_EXCHANGE) falls back to two renames,
    # which report a real problem (permissions, a busy mount point) with a proper OSError.
    return _libc_renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def swap_into_place(tmp: Path, dest: Path) -> None:
    if not os.path.lexists(dest):
        os.rename(tmp, dest)
    elif _exchange(tmp, dest):
        remove(tmp)  # now holds the previous contents of dest
    else:
        old = dest.parent / f".{dest.name}{_OLD}{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(dest, old)
        try:
            os.rename(tmp, dest)
        except BaseException:
            os.rename(old, dest)
            raise
        remove(old)
    fsync_dir(dest.parent)
