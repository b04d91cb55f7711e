"""The advisory lock that keeps two writers of one destination apart: ``flock`` on ``.NAME.lock`` beside it."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from eagle3_trt.atomic.paths import FILE_MODE, lock_path
from eagle3_trt.errors import UserError


def lock(dest: Path, wait_s: float = 0.0) -> int | None:
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


def unlock(dest: Path, fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.unlink(lock_path(dest))  # while still locked, see lock
    except OSError:
        pass
    os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
