"""Retention of a capture directory that several writers share (``SegmentWriter.retain``).

Age is the records' own ``time_unix`` (when each request finished, the wall clock every writer on the
host shares), not the order writers started in: two workers write segments whose times interleave.
Retention picks a cut-off time and deletes every record at or before it, from every writer's closed
segments: a segment whose records all lie before it is deleted, one that straddles it is rewritten
(atomically) without its older records. So no record newer than the oldest surviving one is missing.

A segment still being written is never deleted or rewritten: its writer holds a lease, the file
``.<segment name>.lease`` locked with ``flock`` for as long as the segment is open, holding the time
of its first record. The cut-off stays below every open segment's first record. A lease whose lock
is free (its writer closed the segment, or died) no longer counts and is removed. Writers close a
segment after ``segment_s`` seconds as well as when it is full, so an idle writer cannot hold the
cut-off back for long. Retention passes of different writers take turns (``.retention.lock``).

Records a writer holds but has not written yet (a serving process's queue) are held by a writer
lease, ``.writer-<pid>-<n>.lease`` (``Hold``): locked for the writer's life, holding a time no record it
holds or will receive is older than (its queue's oldest record, or the time it saw the queue empty).
The cut-off stays below every live hold too, so a record that waited in a queue past a cut never lands
after it.
"""

from __future__ import annotations

import fcntl
import itertools
import math
import os
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eagle3_trt.atomic import write_bytes
from eagle3_trt.atomic.lock import lock, unlock

LEASE_GLOB = ".traffic-*.jsonl.lease"
HOLD_GLOB = ".writer-*.lease"
_HOLD_WIDTH = 32  # bytes of a hold's time: rewritten in place, always this long
_TIME_KEY = b'"time_unix":'


def lease_path(segment: Path) -> Path:
    return segment.with_name(f".{segment.name}.lease")


class Lease:
    """This writer's claim on its open segment (module doc). Created under a staging name, locked,
    then renamed into place: a lease visible under its name is always locked by a live writer."""

    def __init__(self, segment: Path, first_time: float) -> None:
        self.path = lease_path(segment)
        stage = self.path.with_name(f"{self.path.name}.{os.getpid()}.stage")
        fd = os.open(stage, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, repr(float(first_time)).encode("ascii"))
            os.rename(stage, self.path)
        except BaseException:
            os.close(fd)
            stage.unlink(missing_ok=True)
            raise
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)  # before the unlock: a free lock on a lease file always means a dead lease
        os.close(self._fd)
        self._fd = None


class Hold:
    """A writer's claim on the records it holds but has not written (module doc): ``update`` rewrites
    its time in place. Created as ``Lease`` is (staged, locked, renamed), so a visible hold is live."""

    _serial = itertools.count()

    def __init__(self, d: Path, floor: float) -> None:
        self.path = Path(d) / f".writer-{os.getpid()}-{next(Hold._serial)}.lease"
        stage = self.path.with_name(f"{self.path.name}.stage")
        fd = os.open(stage, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, _hold_bytes(floor))
            os.rename(stage, self.path)
        except BaseException:
            os.close(fd)
            stage.unlink(missing_ok=True)
            raise
        self._fd: int | None = fd

    def update(self, floor: float) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, _hold_bytes(floor), 0)

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def _hold_bytes(floor: float) -> bytes:
    return repr(float(floor)).encode("ascii").ljust(_HOLD_WIDTH)


def _live(d: Path, glob: str) -> Iterator[tuple[Path, float]]:
    """(lease, its time) of every live lease matching ``glob``; dead ones removed. A time that does not
    parse (being written) is -inf: hold everything back this once."""
    for p in Path(d).glob(glob):
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raw = os.pread(fd, 64, 0)
                try:
                    t = float(raw)
                except ValueError:
                    t = -math.inf
                yield p, t
                continue
            p.unlink(missing_ok=True)  # its writer is gone (or closed it)
        finally:
            os.close(fd)


def holds(d: Path) -> list[float]:
    """The times of the live writer holds (``Hold``) in ``d``."""
    return [t for _, t in _live(d, HOLD_GLOB)]


def open_segments(d: Path) -> dict[str, float]:
    """Segment name -> first record time of every segment some writer has open; dead leases removed."""
    return {p.name[1 : -len(".lease")]: t for p, t in _live(d, LEASE_GLOB)}


@contextmanager
def retention_lock(d: Path) -> Iterator[None]:
    """The directory's retention passes one at a time (``.retention.lock``; atomic/lock.py's flock)."""
    fd = lock(Path(d) / "retention", wait_s=10.0)
    try:
        yield
    finally:
        unlock(Path(d) / "retention", fd)


def line_times(data: bytes) -> tuple[array[float], array[int]]:
    """(time_unix, line bytes with its newline) of each line of a segment. The top-level key is found
    as bytes: inside a JSON string a quote is escaped, so ``"time_unix":`` can only be the key
    (``request_id``, the one string before it, cannot forge it)."""
    times, sizes = array("d"), array("Q")
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end + 1
        k = data.find(_TIME_KEY, start, end)
        if k < 0:
            raise ValueError(f"a line without time_unix at byte {start}")
        v0 = k + len(_TIME_KEY)
        v1 = v0
        while v1 < end and data[v1 : v1 + 1] not in (b",", b"}"):
            v1 += 1
        times.append(float(data[v0:v1]))
        sizes.append(end - start)
        start = end
    return times, sizes


@dataclass
class _Seg:
    path: Path
    key: tuple[int, int]  # (st_mtime_ns, st_size) the times were read at
    times: array[float]
    sizes: array[int]


class Retention:
    """One writer's retention passes (``retain``), with the closed segments' record times cached
    by (mtime, size): each segment is read once unless it changes."""

    def __init__(self, d: Path) -> None:
        self.dir = Path(d)
        self._cache: dict[str, _Seg] = {}

    def _closed(self, paths: list[Path], open_names: set[str]) -> tuple[list[_Seg], int]:
        segs, open_bytes = [], 0
        seen = set()
        for p in paths:
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            if p.name in open_names:
                open_bytes += st.st_size
                continue
            seen.add(p.name)
            key = (st.st_mtime_ns, st.st_size)
            c = self._cache.get(p.name)
            if c is None or c.key != key:
                try:
                    times, sizes = line_times(p.read_bytes())
                except (FileNotFoundError, ValueError):
                    continue  # gone, or not a capture segment: not this pass's to judge
                c = self._cache[p.name] = _Seg(p, key, times, sizes)
            segs.append(c)
        for name in set(self._cache) - seen:
            del self._cache[name]
        return segs, open_bytes

    def retain(self, paths: list[Path], *, keep_bytes: int | None, keep_age_s: float | None, now: float) -> list[Path]:
        """Apply the module doc's cut-off to ``paths`` (the directory's segments; the caller holds
        ``retention_lock``). The segments deleted or rewritten."""
        opened = open_segments(self.dir)
        segs, open_bytes = self._closed(paths, set(opened))
        cut = -math.inf  # records with time <= cut go
        if keep_age_s is not None:
            cut = now - keep_age_s
        total = open_bytes + sum(sum(s.sizes) for s in segs)
        if keep_bytes is not None and total > keep_bytes:
            recs = sorted((t, n) for s in segs for t, n in zip(s.times, s.sizes))
            need, freed = total - keep_bytes, 0
            for i, (t, n) in enumerate(recs):
                freed += n
                if freed >= need and (i + 1 == len(recs) or recs[i + 1][0] > t):
                    cut = max(cut, t)
                    break
            else:
                cut = math.inf
        floors = list(opened.values()) + holds(self.dir)
        if floors:  # never past an open segment's first record, nor a record a writer holds unwritten
            cut = min(cut, math.nextafter(min(floors), -math.inf))
        changed: list[Path] = []
        for s in segs:
            if not s.times or min(s.times) > cut:
                continue
            if max(s.times) <= cut:
                s.path.unlink(missing_ok=True)
                self._cache.pop(s.path.name, None)
            else:
                data = s.path.read_bytes()
                keep, off = [], 0
                for t, n in zip(s.times, s.sizes):
                    if t > cut:
                        keep.append(data[off : off + n])
                    off += n
                write_bytes(s.path, b"".join(keep))
            changed.append(s.path)
        return changed
