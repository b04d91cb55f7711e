"""The one atomic writer: whole directories and single files appear complete or not at all.

Every output of the toolkit (bundles, Triton repositories, reports, trained drafts, caches) is
written through this module, so all of them share the same guarantees:

- staged next to the destination (same filesystem, so the final ``os.replace`` is atomic) and
  renamed into place only when complete; readers never see a half-written directory or file;
- fsynced before the rename, so a crash right after it does not leave empty files behind;
- directories 0755 and files 0644 (``mkdtemp``/``mkstemp`` create 0700/0600, which a Triton
  container running as another user cannot read);
- a failure, SIGINT or SIGTERM (``docker stop``, Kubernetes) removes the staging directory;
- staging directories left by a process that was SIGKILLed are removed by the next writer of
  the same destination;
- a full disk is reported as one line naming the destination.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError

DIR_MODE = 0o755
FILE_MODE = 0o644
_STAGING = ".tmp-"
_OLD = ".old-"


def _staging_prefix(dest: Path) -> str:
    return f".{dest.name}{_STAGING}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging(dest: Path) -> list[Path]:
    """Delete staging/old directories of ``dest`` whose writer process is gone (pid in the name)."""
    dest = Path(dest)
    removed = []
    if not dest.parent.is_dir():
        return removed
    for marker in (_STAGING, _OLD):
        for p in dest.parent.glob(f".{dest.name}{marker}*"):
            pid_part = p.name[len(f".{dest.name}{marker}"):].split("-", 1)[0]
            if pid_part.isdigit() and int(pid_part) != os.getpid() and not _pid_alive(int(pid_part)):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def fix_modes(root: Path) -> None:
    """0755 for every directory, 0644 for every file (0755 where the owner may execute it)."""
    root = Path(root)
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for p in paths:
        if p.is_symlink():
            continue
        if p.is_dir():
            os.chmod(p, DIR_MODE)
        else:
            os.chmod(p, DIR_MODE if p.stat().st_mode & 0o100 else FILE_MODE)


def _fsync_tree(root: Path) -> None:
    for p in [*root.rglob("*"), root]:
        if p.is_symlink():
            continue
        flags = os.O_RDONLY | (os.O_DIRECTORY if p.is_dir() else 0)
        try:
            fd = os.open(p, flags)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    # safetensors and some libraries wrap ENOSPC in their own exception type
    text = str(e)
    return "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM raises like SIGINT inside the block, so ``finally`` clean-up runs on ``docker stop``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    prev = signal.getsignal(signal.SIGTERM)

    def _term(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    if prev in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _term)
    try:
        yield
    finally:
        if prev in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, prev or signal.SIG_DFL)


@contextmanager
def staged_dir(dest: Path) -> Iterator[Path]:
    """Yield an empty directory beside ``dest``; on success it replaces ``dest``, on any error it is removed.

    The old ``dest`` stays in place until the new one is complete and is deleted only after the
    swap. SIGTERM is handled like SIGINT for the duration. A full disk becomes a one-line
    ``UserError`` naming ``dest``.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(dest)}{os.getpid()}-", dir=dest.parent))
    try:
        with _signals_raise():
            yield tmp
            fix_modes(tmp)
            _fsync_tree(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if _disk_full(e):
            raise UserError(dest, "no space left on the device while writing it", "free space or pass another output directory") from None
        raise
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}{_OLD}{os.getpid()}"
        os.replace(dest, old)
    os.replace(tmp, dest)
    _fsync_dir(dest.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_bytes(path: Path, data: bytes, mode: int = FILE_MODE) -> Path:
    """Write one file atomically (temp file beside it, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{_STAGING}{os.getpid()}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if _disk_full(e):
            raise UserError(path, "no space left on the device while writing it", "free space or pass another output path") from None
        raise
    _fsync_dir(path.parent)
    return path


def write_text(path: Path, text: str, mode: int = FILE_MODE) -> Path:
    return write_bytes(path, text.encode(), mode)


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, default=str) + "\n")
