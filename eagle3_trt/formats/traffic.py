"""Captured traffic: the one schema, writer and reader for ``serve --capture DIR`` (issue 23).

A capture directory holds segments ``traffic-<unix ms the segment was opened>-<pid>-<n>.jsonl``, one
JSON record per line (``TrafficRecord``), plus nothing else the reader cares about (dot files: the
open segments' leases and the retention lock, formats/traffic_retention.py). Each segment file is only
ever written whole through the atomic writer (staged, fsynced, renamed), so a reader sees a
segment as it was at its last flush or not at all, never half a record. The open segment is
rewritten at each flush; once it is full (or old) the writer moves on to the next.

Readers: ``segment_lines`` reads one segment (each record with its byte offset, so that a second
pass can come back for it: ``record_at``); ``iter_traffic`` streams the capture one segment at a
time (memory bounded by one segment whatever the capture's size); ``read_traffic`` is every record
in a list, oldest first, for small captures (tests, examples: the commands stream, see
traffic_split.split_capture); a truncated or foreign segment is a one-line UserError naming the file and line. Writers:
``SegmentWriter`` (synchronous; the serving side runs it off the request path, see runtime/capture.py).

Deletion is final: a writer never recreates what was deleted under it. When its directory is gone
(or replaced by another directory of the same name) it raises ``CaptureDirGone`` and writes nothing
more; when its open segment was deleted (by hand or by another writer's retention), the records
that segment held are dropped and the writer goes on in a new segment. Retention
(``SegmentWriter.retain``, formats/traffic_retention.py) deletes records oldest first by their own
time, across writers, and never touches a segment any writer still has open.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3_trt.atomic import make_dirs, write_text
from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic_retention import Lease, Retention, retention_lock

SEGMENT_GLOB = "traffic-*.jsonl"
_SEGMENT_RE = re.compile(r"^traffic-(\d+)-(\d+)-(\d+)\.jsonl$")
SCHEMA: Literal[1] = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CapturedSampling(_Strict):
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int
    seed: int | None = None


class ServedAcceptance(_Strict):
    """What the server reported for this request (runtime/llm_api.SpecStats)."""

    speculative: bool
    draft_tokens: int = Field(ge=0)
    accepted_draft_tokens: int = Field(ge=0)
    target_forwards: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)

    @property
    def acceptance_length(self) -> float:
        return self.completion_tokens / self.target_forwards if self.target_forwards else 0.0


class TrafficRecord(_Strict):
    """One finished request as the model saw it."""

    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    request_id: str
    time_unix: float = Field(description="when the request finished")
    bundle_fingerprint: str = Field(description="the served bundle's manifest fingerprint")
    model: str = Field(description="the served model name (Triton model or Dynamo served name)")
    model_version: str | None = None
    frontend: Literal["triton", "dynamo"]
    chat: bool = Field(description="the prompt went through the chat template (prompt_text is the templated text)")
    prompt_text: str | None = Field(description="the prompt as the model saw it, after redaction")
    prompt_ids: list[int] = Field(min_length=1)
    output_ids: list[int]
    output_text: str | None = None
    finish_reason: str | None = None
    sampling: CapturedSampling
    acceptance: ServedAcceptance
    category: str | None = None
    redacted: bool = False

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def to_line(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), separators=(",", ":"), ensure_ascii=False)


_SEGMENT_SERIAL = itertools.count()  # per process: two writers of one process never share a name


def segment_name(start_ms: int, n: int, pid: int | None = None) -> str:
    """``traffic-<ms the segment was opened>-<pid>-<n>.jsonl`` (``n``: this process's segment serial)."""
    return f"traffic-{start_ms:013d}-{os.getpid() if pid is None else pid}-{n:06d}.jsonl"


def segments(d: Path) -> list[Path]:
    """The capture directory's segments, oldest first (by the time each was opened, writer, number)."""

    def key(p: Path) -> tuple[int, int, int]:
        m = _SEGMENT_RE.match(p.name)
        assert m is not None
        return int(m.group(1)), int(m.group(2)), int(m.group(3))

    return sorted((p for p in Path(d).glob(SEGMENT_GLOB) if _SEGMENT_RE.match(p.name)), key=key)


def segment_lines(f: Path) -> Iterator[tuple[int, bytes, TrafficRecord]]:
    """The one segment reader: each record of the segment file ``f`` with its line's byte offset and
    raw bytes (without the newline), so a reader can come back for one record (``record_at``).
    The file is read whole (one segment's worth of memory) and checked before the first record."""
    data = Path(f).read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f, "is not UTF-8 text", "capture segments are JSON lines written by serve --capture") from None
    if data and not data.endswith(b"\n"):
        raise UserError(f, "ends in the middle of a record (truncated)", "remove or restore the segment; the writer never leaves one like this")

    def lines() -> Iterator[tuple[int, bytes, TrafficRecord]]:
        off = 0
        for n, raw in enumerate(data.split(b"\n")[:-1] if data else [], 1):
            yield off, raw, _parse(raw, f"{f}:{n}")
            off += len(raw) + 1

    return lines()


def _parse(raw: bytes, where: str) -> TrafficRecord:
    try:
        return TrafficRecord.model_validate_json(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "record"
        raise UserError(where, f"not a traffic record ({loc}: {err['msg']})", "capture segments are written by serve --capture") from None


def line_check(raw: bytes) -> bytes:
    """8 bytes naming a record's line, kept by a first pass so that ``record_at`` can tell it is back."""
    return hashlib.blake2b(raw, digest_size=8).digest()


class LineReader:
    """Lines an earlier pass saw, read back through one open segment at a time (``record_at``'s check),
    for a reader that comes back for many lines in file order (the split's near-duplicate candidates)."""

    def __init__(self) -> None:
        self._f: Path | None = None
        self._fh: BinaryIO | None = None

    def line(self, f: Path, offset: int, size: int, check: bytes) -> bytes:
        if self._f != f:
            self.close()
            try:
                self._fh = open(f, "rb")  # noqa: SIM115 (kept open across calls; close() ends it)
            except FileNotFoundError:
                _changed(f)
            self._f = f
        assert self._fh is not None
        self._fh.seek(offset)
        raw = self._fh.read(size + 1)
        if raw[size:] != b"\n" or line_check(raw[:size]) != check:
            _changed(f)
        return raw[:size]

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._f = self._fh = None


def _changed(f: Path) -> NoReturn:
    raise UserError(f, "changed while it was being read (a segment deleted or replaced)", "read the capture again; stop retention while reading it")


def record_at(f: Path, offset: int, size: int, check: bytes) -> TrafficRecord:
    """The record whose ``size``-byte line (``line_check`` ``check``) was read at byte ``offset`` of
    segment ``f`` by an earlier pass: a one-line UserError when the segment no longer holds it (deleted
    by retention or by hand since; the open segment is rewritten with its earlier lines in place)."""
    try:
        with open(f, "rb") as fh:
            fh.seek(offset)
            raw = fh.read(size + 1)
    except FileNotFoundError:
        raw = b""
    if raw[size:] != b"\n" or line_check(raw[:size]) != check:
        _changed(f)
    return _parse(raw[:size], f"{f}@{offset}")


def read_segment(f: Path) -> list[TrafficRecord]:
    return [r for _, _, r in segment_lines(f)]


def iter_traffic(d: Path) -> Iterator[TrafficRecord]:
    """The records under the capture directory ``d``, segment after segment (oldest segment first;
    concurrent writers' records interleave by segment, not by time). Holds one segment at a time:
    a reader that keeps only what it needs runs in bounded memory however large the capture.
    The directory is checked before the first record is yielded."""
    return (r for s in capture_segments(d) for r in read_segment(s))


def capture_segments(d: Path) -> list[Path]:
    """``segments(d)``, refused in one line when ``d`` is not a capture directory or holds none."""
    d = Path(d)
    if not d.is_dir():
        raise UserError(d, "is not a directory", "pass the directory given to serve --capture")
    segs = segments(d)
    if not segs:
        raise UserError(d, "holds no capture segments (traffic-*.jsonl)", "serve with --capture DIR and send some requests first")
    return segs


def read_traffic(d: Path) -> list[TrafficRecord]:
    """Every record under the capture directory ``d`` in one list, oldest first: for small captures
    (tests, examples). The commands read through ``iter_traffic`` or ``traffic_split.split_capture``."""
    return sorted(iter_traffic(d), key=lambda r: r.time_unix)


def traffic_digest(records: Iterable[TrafficRecord]) -> str:
    """sha256 over the records' canonical lines, order-independent: names the traffic a head was trained on."""
    return digest_sorted_lines(sorted(r.to_line() for r in records))


def digest_sorted_lines(lines: Iterable[str]) -> str:
    """``traffic_digest`` of records whose canonical lines come in sorted order (streamed: see
    traffic_split.CaptureSplit.train_digest)."""
    h = hashlib.sha256()
    for ln in lines:
        h.update(ln.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


class CaptureDirGone(Exception):
    """The writer's directory was deleted or replaced since it started: it writes nothing more."""


class SegmentWriter:
    """Appends records to rotating segments; ``flush`` rewrites the open segment atomically.

    Not thread-safe: one writer thread owns it. ``max_bytes`` caps the bytes of this writer's
    segments still on disk; ``write`` returns False (and writes nothing) once a record would pass it.
    A segment is closed once it holds ``segment_records`` records, ``segment_bytes`` bytes (each
    flush rewrites the open segment whole, so this bounds a flush's work when records are large) or
    has been open ``segment_s`` seconds (``rotate_in``: an idle writer's open segment would hold
    retention back). While open, a segment is leased (formats/traffic_retention.Lease): no other
    writer's retention touches it. ``close`` flushes and gives the lease up."""

    def __init__(
        self,
        d: Path,
        *,
        segment_records: int = 256,
        max_bytes: int | None = None,
        segment_bytes: int | None = None,
        segment_s: float | None = None,
    ) -> None:
        self.dir = make_dirs(Path(d))
        self._dir_id = self._identity()
        self.segment_records = int(segment_records)
        self.segment_bytes = segment_bytes
        self.segment_s = segment_s
        self.max_bytes = max_bytes
        self._path: Path | None = None  # the open segment (named when its first record is written)
        self._lease: Lease | None = None
        self._opened = 0.0  # monotonic time the open segment got its first record
        self._lines: list[str] = []
        self._closed: dict[Path, int] = {}  # this writer's closed segments -> bytes on disk
        self._open_bytes = 0
        self._dirty = False
        self._flushed = 0  # lines of the open segment on disk (its file exists once this is > 0)
        self._retention = Retention(self.dir)

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.dir)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _check_dir(self) -> None:
        if self._identity() != self._dir_id:
            self._lines, self._open_bytes, self._dirty = [], 0, False
            self._release()
            raise CaptureDirGone(f"{self.dir} was deleted or replaced")

    @property
    def bytes_written(self) -> int:
        """Bytes of this writer's segments: the closed ones as last seen on disk, and the open one."""
        return sum(self._closed.values()) + self._open_bytes

    def _open(self, first_time: float) -> None:
        self._check_dir()
        self._path = self.dir / segment_name(int(time.time() * 1000), next(_SEGMENT_SERIAL))
        self._lease = Lease(self._path, first_time)
        self._opened = time.monotonic()

    def release(self) -> None:
        """Give up the open segment's lease without writing (a writer that stopped)."""
        self._release()

    def _release(self) -> None:
        if self._lease is not None:
            self._lease.release()
        self._lease, self._path = None, None

    def _rotate(self) -> None:
        """Close the open segment: written, its lease given up; the next record opens another."""
        self.flush()
        if self._path is not None and self._flushed:
            self._closed[self._path] = self._open_bytes
        self._release()
        self._open_bytes, self._lines, self._flushed = 0, [], 0

    def rotate_in(self) -> float | None:
        """Seconds until the open segment is due to close by age (``segment_s``); None when none is open."""
        if self.segment_s is None or self._path is None:
            return None
        return max(0.0, self._opened + self.segment_s - time.monotonic())

    def rotate_if_due(self) -> None:
        due = self.rotate_in()
        if due is not None and due <= 0.0:
            self._rotate()

    def write(self, rec: TrafficRecord) -> bool:
        line = rec.to_line() + "\n"
        size = len(line.encode("utf-8"))
        if self.max_bytes is not None and self.bytes_written + size > self.max_bytes:
            return False
        self.rotate_if_due()
        if self._path is None:
            self._open(rec.time_unix)
        self._lines.append(line)
        self._open_bytes += size
        self._dirty = True
        if len(self._lines) >= self.segment_records or (self.segment_bytes is not None and self._open_bytes >= self.segment_bytes):
            self._rotate()
        return True

    def flush(self) -> None:
        """Rewrite the open segment. ``CaptureDirGone`` when the directory was deleted or replaced
        (nothing is written, and the records held are dropped)."""
        if self._dirty and self._lines and self._path is not None:
            self._check_dir()
            if self._flushed and not self._path.exists():  # deleted under us (by hand): what it held stays deleted
                gone = self._lines[: self._flushed]
                self._open_bytes -= sum(len(ln.encode("utf-8")) for ln in gone)
                rest = self._lines[self._flushed :]
                self._release()
                self._open(_line_time(rest[0]))
                self._lines, self._flushed = rest, 0
            path = self._path
            assert path is not None
            write_text(path, "".join(self._lines))
            if self._identity() != self._dir_id:  # deleted between the check and the write: undo
                path.unlink(missing_ok=True)
                try:
                    self.dir.rmdir()
                except OSError:
                    pass
                self._check_dir()
            self._flushed = len(self._lines)
        self._dirty = False

    def close(self) -> None:
        """Flush and give up the open segment's lease (nothing more is written)."""
        try:
            if self._identity() == self._dir_id:
                self.flush()
        finally:
            self._release()

    def refresh(self) -> None:
        """Re-read the sizes of this writer's closed segments (other writers' retention may have
        deleted or trimmed them)."""
        for p in list(self._closed):
            try:
                self._closed[p] = p.stat().st_size
            except FileNotFoundError:
                del self._closed[p]

    def retain(self, *, keep_bytes: int | None = None, keep_age_s: float | None = None, now: float | None = None) -> list[Path]:
        """Delete the directory's records (every writer's) at or before a cut-off time: older than
        ``keep_age_s``, and as many more, oldest first, as bring the directory's segments to
        ``keep_bytes`` or less; segments still open in any writer are never touched
        (formats/traffic_retention). The segments deleted or rewritten."""
        self._check_dir()
        now = time.time() if now is None else now
        with retention_lock(self.dir):
            changed = self._retention.retain(segments(self.dir), keep_bytes=keep_bytes, keep_age_s=keep_age_s, now=now)
        self.refresh()
        return changed


def _line_time(line: str) -> float:
    return float(json.loads(line)["time_unix"])
