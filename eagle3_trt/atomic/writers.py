"""The writers: a whole directory (``staged_dir``) and single files (``write_bytes``/``text``/``json``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle3_trt.atomic.failures import cannot_write, disk_full, full_disk_error
from eagle3_trt.atomic.lock import lock, unlock
from eagle3_trt.atomic.paths import FILE_MODE, fix_modes, fsync_dir, fsync_tree, make_dirs, remove, remove_stale_staging, staging_prefix, swap_into_place
from eagle3_trt.atomic.signals import interrupts_raise, raise_if_deferred, signals_held

# set by ``discarding_writes``: a tensor-parallel run's ranks other than 0 compute what rank 0 computes
# and write nothing (rank 0 writes the run's outputs once)
_DISCARD = {"on": False}


@contextmanager
def discarding_writes() -> Iterator[None]:
    """Inside this block every writer of this module writes nothing: ``staged_dir`` yields a private
    scratch directory that is removed afterwards, the file writers return the path untouched."""
    before = _DISCARD["on"]
    _DISCARD["on"] = True
    try:
        yield
    finally:
        _DISCARD["on"] = before


@contextmanager
def staged_dir(dest: Path, wait_s: float = 0.0) -> Iterator[Path]:
    """Yield an empty directory beside ``dest``; on success it replaces ``dest``, on any error it is removed.

    The old ``dest`` stays in place until the new one is complete and is deleted only after the
    swap. Holds ``dest``'s lock for the duration: a second writer gets a ``UserError`` at once, or
    after ``wait_s`` seconds (for short writes such as caches, where waiting is the better answer).
    SIGTERM is handled like SIGINT for the duration only (signals.interrupts_raise). A full disk becomes a one-line ``UserError``
    naming ``dest``.
    """
    dest = Path(dest)
    if _DISCARD["on"]:
        scratch = Path(tempfile.mkdtemp(prefix="eagle3-trt-discarded-"))
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    with interrupts_raise():
        try:
            make_dirs(dest.parent)
            held = lock(dest, wait_s)
        except OSError as e:
            raise (cannot_write(dest, e) or e) from None
        try:
            remove_stale_staging(dest)
            tmp: Path | None = None
            try:
                with signals_held():
                    tmp = Path(tempfile.mkdtemp(prefix=f"{staging_prefix(dest)}{os.getpid()}-", dir=dest.parent))
                yield tmp
                raise_if_deferred()
                fix_modes(tmp)
                fsync_tree(tmp)  # a SIGTERM meanwhile is deferred (it would land in this package's frames)
                raise_if_deferred()
                with signals_held():
                    swap_into_place(tmp, dest)
            except BaseException as e:
                full = disk_full(e, dest.parent)
                with signals_held():
                    if tmp is not None and os.path.lexists(tmp):
                        remove(tmp)
                if full:
                    raise full_disk_error(dest) from None
                raise
        finally:
            unlock(dest, held)


def write_bytes(path: Path, data: bytes, mode: int = FILE_MODE) -> Path:
    """Write one file atomically (temp file beside it, fsync, rename); ``mode`` whatever the umask."""
    path = Path(path)
    if _DISCARD["on"]:
        return path
    with interrupts_raise():
        try:
            make_dirs(path.parent)
        except OSError as e:
            raise (cannot_write(path, e) or e) from None
        remove_stale_staging(path)
        tmp: str | None = None
        try:
            with signals_held():
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{staging_prefix(path)}{os.getpid()}-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            with signals_held():
                os.replace(tmp, path)
                tmp = None
        except BaseException as e:
            full = disk_full(e, path.parent)
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            if full:
                raise full_disk_error(path) from None
            if isinstance(e, OSError) and tmp is None and (err := cannot_write(path, e)):
                raise err from None
            raise
        fsync_dir(path.parent)
    return path


def write_text(path: Path, text: str, mode: int = FILE_MODE) -> Path:
    return write_bytes(path, text.encode(), mode)


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, default=str) + "\n")
