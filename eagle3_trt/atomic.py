"""The one atomic writer: whole directories and single files appear complete or not at all.

Every output of the toolkit (bundles, Triton repositories, reports, trained drafts, caches) is
written through this module, so all of them share the same guarantees:

- staged next to the destination (same filesystem, so the final rename is atomic) and renamed
  into place only when complete; readers never see a half-written directory or file. Replacing an
  existing directory uses ``renameat2(RENAME_EXCHANGE)`` where the kernel and filesystem support
  it, so the destination never disappears, not even for a moment (a Triton server polling its
  repository would unload the model); elsewhere it falls back to two renames;
- fsynced before the rename (an fsync error such as a delayed ``ENOSPC`` fails the write instead
  of renaming a short file into place), and the parent directory after it;
- directories 0755 and files 0644, 0755 where the owner may execute (``mkdtemp``/``mkstemp``
  create 0700/0600 and a umask of 077 does the same to everything else; a Triton container
  running as another user could not read the output). Parent directories this module creates
  are 0755 too;
- a failure, SIGINT or SIGTERM (``docker stop``, Kubernetes) removes the staging directory;
  SIGTERM raises ``KeyboardInterrupt`` while a ``staged_dir`` is open, and both signals are held
  back for the few milliseconds of a rename or clean-up, so neither is left half done;
- staging directories left by a process that was SIGKILLed are removed by the next writer of the
  same destination (the writer's pid is in the name; a live writer's are kept);
- two writers of the same directory: the second is refused with one line naming the holder's
  pid, through an advisory ``flock`` on ``.NAME.lock`` beside the destination (a build can take
  hours, so waiting would look like a hang). The lock file is never inside the output, is removed
  on release, and a left-over one (SIGKILL) is harmless: the kernel drops the lock with the process;
- a full disk is reported as one line naming the destination.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
_FULL_HINT = "free some space or pass another output path"


def staging_prefix(dest: Path) -> str:
    """Name prefix of the staging entries of ``dest``: ``.NAME.tmp-<pid>-``."""
    return f".{Path(dest).name}{_STAGING}"


def lock_path(dest: Path) -> Path:
    """The advisory lock file of ``dest``: ``.NAME.lock`` in the same parent directory."""
    dest = Path(dest)
    return dest.parent / f".{dest.name}{_LOCK}"


# ---------------------------------------------------------------- signals


def _in_main_thread() -> bool:
    # signal.signal() may only be called from the main thread
    return threading.current_thread() is threading.main_thread()


class _Term:
    """SIGTERM bookkeeping while ``_term_raises`` has its handler installed (main thread only).

    A KeyboardInterrupt raised by a signal handler is lost when the handler happens to run inside
    a ``__del__`` method or a weakref/GC callback: Python prints "Exception ignored in ..." and
    carries on (seen here: SIGTERM landing in ``regex``'s ``Group.__del__`` while transformers was
    importing, and the build then completed with exit 0). Such a lost interrupt is caught by
    ``sys.unraisablehook`` and marked ``deferred``; it is then raised again by a SIGTERM the
    process re-sends itself every second, and at the latest when the ``staged_dir`` body ends,
    so an interrupted writer never puts its output in place."""

    deferred = False
    resend: threading.Timer | None = None
    # SIGINT's KeyboardInterrupt can be swallowed the same way; the hook defers it alike.


def _on_sigterm(signum, frame):
    if frame is not None and frame.f_code.co_filename == __file__:
        # inside the writer's own bookkeeping (between the body and its clean-up, say): raising
        # here could skip the clean-up; the end of the body or the re-sent signal acts on it
        _defer()
        return
    _Term.deferred = False
    raise KeyboardInterrupt(f"signal {signum}")


def _defer() -> None:
    _Term.deferred = True
    if _Term.resend is None or not _Term.resend.is_alive():
        _Term.resend = threading.Timer(1.0, _resend)
        _Term.resend.daemon = True
        _Term.resend.start()


def _resend() -> None:
    if _Term.deferred and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        os.kill(os.getpid(), signal.SIGTERM)


def _raise_if_deferred() -> None:
    if _Term.deferred:
        _Term.deferred = False
        raise KeyboardInterrupt("signal 15 (received earlier, its exception was swallowed)")


@contextmanager
def _term_raises() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside the block, so clean-up runs on ``docker stop``.

    Only when SIGTERM has its default action: a handler someone installed (a server's graceful
    shutdown, an outer ``staged_dir``) or an ignored SIGTERM is left as it is."""
    if not _in_main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    prev_hook = sys.unraisablehook

    def hook(u):
        if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
            _defer()  # handled: raised again later; Python's "Exception ignored" traceback would only confuse
            return
        prev_hook(u)

    _Term.deferred = False
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.unraisablehook = hook
    try:
        yield
        _raise_if_deferred()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.unraisablehook = prev_hook
        _Term.deferred = False


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done, then take their course.

    Used around renames and clean-up: an interrupt between the two renames of a swap, or in the
    middle of removing a staging directory, would leave more behind than a late exit does."""
    if not _in_main_thread():
        yield
        return
    got: list[int] = []
    prev: dict[int, Any] = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        h = signal.getsignal(s)
        if h is None or h is signal.SIG_IGN:  # installed outside Python (cannot restore it) or ignored
            continue
        prev[s] = h
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for s, h in prev.items():
            signal.signal(s, h)
        if got:
            signal.raise_signal(got[0])  # now handled by the restored handler (raise, or the default exit)


# ---------------------------------------------------------------- file system helpers


def _remove(p: Path) -> None:
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
                _remove(p)
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


def _fsync_tree(root: Path) -> None:
    for p, is_dir in _walk(root):  # files first, the root directory last
        _fsync(p, is_dir)


def _fsync_dir(d: Path) -> None:
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


def _swap_into_place(tmp: Path, dest: Path) -> None:
    if not os.path.lexists(dest):
        os.rename(tmp, dest)
    elif _exchange(tmp, dest):
        _remove(tmp)  # now holds the previous contents of dest
    else:
        old = dest.parent / f".{dest.name}{_OLD}{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(dest, old)
        try:
            os.rename(tmp, dest)
        except BaseException:
            os.rename(old, dest)
            raise
        _remove(old)
    _fsync_dir(dest.parent)


# ---------------------------------------------------------------- errors


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        yield x
        x = x.__cause__ or x.__context__


def _free_bytes(d: Path) -> int | None:
    try:
        st = os.statvfs(d)
    except OSError:
        return None
    # root may use the blocks ext4 reserves for it, so f_bavail = 0 is not "full" for root
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def _disk_full(e: BaseException, where: Path) -> bool:
    """Whether ``e`` means the disk (or quota) is full; call before removing the staged output."""
    if not isinstance(e, Exception) or isinstance(e, UserError):  # interrupts, exits, our own one-line errors
        return False
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        # safetensors (a Rust IoError) and others wrap ENOSPC in their own exception type
        text = str(x)
        if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
            return True
    # torch.save reports only "PytorchStreamWriter failed writing file ...": a failure while the
    # file system holds less than 1 MiB is taken for a full disk
    free = _free_bytes(where)
    return free is not None and free < (1 << 20)


def _full(dest: Path) -> UserError:
    return UserError(dest, "no space left on the device while writing it; nothing was written", _FULL_HINT)


def _cannot_write(dest: Path, e: OSError) -> UserError | None:
    """One line for a parent directory we may not write into (our own mkdir/lock/mkdtemp only)."""
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "read-only file system" if e.errno == errno.EROFS else "permission denied"
        return UserError(dest, f"cannot write in {dest.parent} ({why})", "pass an output path you can write to")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return _full(dest)
    return None


def check_writable(dest: Path) -> None:
    """Refuse, before any long work, a destination ``staged_dir``/``write_*`` could not write: its
    nearest existing ancestor must be a directory this process may create entries in. Nothing is
    created (a probe directory would be a half-written trace if the work is then interrupted)."""
    dest = Path(dest).absolute()
    p = dest.parent
    while not os.path.lexists(p):
        p = p.parent
    if not p.is_dir():
        raise UserError(dest, f"{p} is not a directory", "pass an output path whose parent is a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        try:
            ro = os.statvfs(p).f_flag & os.ST_RDONLY
        except OSError:
            ro = False
        why = "read-only file system" if ro else "permission denied"
        raise UserError(dest, f"cannot write in {p} ({why})", "pass an output path you can write to")


# ---------------------------------------------------------------- lock


def _lock(dest: Path, wait_s: float = 0.0) -> int | None:
    """Take the exclusive advisory lock on ``.NAME.lock`` beside ``dest``; a second writer gets a UserError
    (after ``wait_s`` seconds of polling).

    Returns the lock's file descriptor, or None on a file system without ``flock``."""
    path = lock_path(dest)
    deadline = time.monotonic() + wait_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            raise UserError(
                dest,
                f"another process{f' (pid {holder})' if holder else ''} is writing it right now",
                "wait until it has finished, or pass another output path",
            ) from None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None  # a file system without flock (some FUSE/NFS setups): write unserialized rather than never
            raise
        # The previous holder unlinks the file before releasing it: if we locked an unlinked inode,
        # a third writer may hold a lock on the new file at that path. Only the file at the path counts.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:  # the pid only serves the refusal message; a full disk must not stop here
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    return fd


def _unlock(dest: Path, fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.unlink(lock_path(dest))  # while still locked, see _lock
    except OSError:
        pass
    os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


# ---------------------------------------------------------------- public API


@contextmanager
def staged_dir(dest: Path, wait_s: float = 0.0) -> Iterator[Path]:
    """Yield an empty directory beside ``dest``; on success it replaces ``dest``, on any error it is removed.

    The old ``dest`` stays in place until the new one is complete and is deleted only after the
    swap. Holds ``dest``'s lock for the duration: a second writer gets a ``UserError`` at once, or
    after ``wait_s`` seconds (for short writes such as caches, where waiting is the better answer).
    SIGTERM is handled like SIGINT for the duration. A full disk becomes a one-line ``UserError``
    naming ``dest``.
    """
    dest = Path(dest)
    with _term_raises():
        try:
            make_dirs(dest.parent)
            lock = _lock(dest, wait_s)
        except OSError as e:
            raise (_cannot_write(dest, e) or e) from None
        try:
            remove_stale_staging(dest)
            tmp: Path | None = None
            try:
                with _signals_held():
                    tmp = Path(tempfile.mkdtemp(prefix=f"{staging_prefix(dest)}{os.getpid()}-", dir=dest.parent))
                yield tmp
                _raise_if_deferred()
                fix_modes(tmp)
                _fsync_tree(tmp)  # a SIGTERM meanwhile is deferred (it would land in this module's frames)
                _raise_if_deferred()
                with _signals_held():
                    _swap_into_place(tmp, dest)
            except BaseException as e:
                full = _disk_full(e, dest.parent)
                with _signals_held():
                    if tmp is not None and os.path.lexists(tmp):
                        _remove(tmp)
                if full:
                    raise _full(dest) from None
                raise
        finally:
            _unlock(dest, lock)


def write_bytes(path: Path, data: bytes, mode: int = FILE_MODE) -> Path:
    """Write one file atomically (temp file beside it, fsync, rename); ``mode`` whatever the umask."""
    path = Path(path)
    with _term_raises():
        try:
            make_dirs(path.parent)
        except OSError as e:
            raise (_cannot_write(path, e) or e) from None
        remove_stale_staging(path)
        tmp: str | None = None
        try:
            with _signals_held():
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{staging_prefix(path)}{os.getpid()}-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            with _signals_held():
                os.replace(tmp, path)
                tmp = None
        except BaseException as e:
            full = _disk_full(e, path.parent)
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            if full:
                raise _full(path) from None
            if isinstance(e, OSError) and tmp is None and (err := _cannot_write(path, e)):
                raise err from None
            raise
        _fsync_dir(path.parent)
    return path


def write_text(path: Path, text: str, mode: int = FILE_MODE) -> Path:
    return write_bytes(path, text.encode(), mode)


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, default=str) + "\n")
