"""The writer's failures as one line naming the destination: a full disk, a directory it may not write in."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

from eagle3_trt.errors import UserError

_FULL_HINT = "free some space or pass another output path"


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


def disk_full(e: BaseException, where: Path) -> bool:
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


def full_disk_error(dest: Path) -> UserError:
    return UserError(dest, "no space left on the device while writing it; nothing was written", _FULL_HINT)


def cannot_write(dest: Path, e: OSError) -> UserError | None:
    """One line for a parent directory we may not write into (our own mkdir/lock/mkdtemp only)."""
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "read-only file system" if e.errno == errno.EROFS else "permission denied"
        return UserError(dest, f"cannot write in {dest.parent} ({why})", "pass an output path you can write to")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return full_disk_error(dest)
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
