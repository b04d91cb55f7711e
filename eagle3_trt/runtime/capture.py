"""Traffic capture on the serving side (issue 23 A): finished requests -> ``formats/traffic`` segments.

``serve --capture DIR`` (Triton) and ``serve-dynamo --capture DIR`` hand the settings to the
processes that run the model through the environment variable ``EAGLE3_CAPTURE`` (a
``CaptureConfig`` as JSON; set only when capture is on, and removed from the servers' environment
otherwise). The serving code there builds one ``Capturer`` and calls ``record`` once per request
that finished by itself (``stop``/``length``); cancelled and failed requests are not recorded.

The request path only puts a tuple on a bounded queue (``put_nowait``: a full queue drops the
record and counts it, it never waits). One background thread per process does everything else:
loads the bundle's tokenizer, decodes ids where the front end has no text (Dynamo), applies the
redaction patterns, re-encodes ids from redacted text, builds the ``TrafficRecord`` and writes it
through ``SegmentWriter`` (each flush rewrites the open segment whole through the atomic writer,
at most every ``flush_s`` and at close). A failure there (disk, tokenizer) turns capture off with
one warning; serving goes on.

Redaction: every pattern is applied to every stored field a client can put text in (prompt and
output text, the request id, the category) before a record reaches the writer. ``redaction_spans``
finds each pattern's match at every start position on the original text (not ``re.sub``'s
left-to-right, non-overlapping matches: with ``sk-[A-Za-z0-9]{20,}``, the first of two adjacent
keys swallows the ``sk`` of the second, whose rest then no longer matches) and for every pattern
on that same text (not on the text an earlier pattern already rewrote); the union of the spans is
replaced, each run by one ``[REDACTED]``. Prompt and output are searched as one text (their
concatenation, as the model saw and wrote them): a key whose start ends the prompt and whose rest the
model wrote matches only there, and each side keeps a ``[REDACTED]`` for its part (``redact_joined``).
The same search runs on what the token ids decode to. Ids: the ids of a side a match touched (in its
text or its decoded ids) are re-encoded from that side's redacted text with the served tokenizer, so
they decode to the redacted text and carry nothing it hid (they are then no longer the ids the model
served: such a record's ``redacted`` is true); the other side's ids are kept as served.

The cap (``max_mb``) is on the capture directory as a whole: every ``traffic-*.jsonl`` in it,
from earlier runs and from the other model instances or workers writing there (rescanned at each
flush, so concurrent writers can pass it by what they write in one flush interval). The first
record that would pass it stops capture in this process with one warning line.

Retention (``keep_mb``, ``keep_hours``): after each flush the capturer deletes the directory's
records, every writer's, oldest first by the records' own time: those older than ``keep_hours``,
then as many as bring the directory to ``keep_mb``; no record newer than the oldest kept one is
deleted, and a segment another writer (or this one) still has open is never touched
(formats/traffic_retention.py). Records still in a capturer's queue are held too: its writer hold
(``Hold``, made before the first record can be queued) carries the time of the queue's oldest record,
and no writer's cut-off passes it. Capture goes on. A directory deleted (or
replaced) while capturing stays deleted: the next flush finds it gone, drops what it held, and
capture stops with one warning; a capturer that has stopped writes nothing more, not even at close.
"""

from __future__ import annotations

import math
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from eagle3_trt.atomic import make_dirs
from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import CaptureDirGone, CapturedSampling, SegmentWriter, ServedAcceptance, TrafficRecord, segments
from eagle3_trt.formats.traffic_retention import Hold
from eagle3_trt.runtime.llm_api import SpecStats

CAPTURE_ENV = "EAGLE3_CAPTURE"
REDACTED = "[REDACTED]"
DEFAULT_MAX_MB = 1024.0
DEFAULT_SEGMENT_S = 300.0  # a segment closes after this long: an open one holds retention back
FLUSH_S = 0.5
QUEUE_SIZE = 4096


class CaptureConfig(BaseModel):
    """What ``--capture DIR --capture-max-mb N --capture-redact REGEX`` set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dir: Path = Field(description="the capture directory (created when the first record is written)")
    max_mb: float = Field(DEFAULT_MAX_MB, gt=0, allow_inf_nan=False, description="cap on the capture directory's segments, MB (10^6 bytes)")
    redact: tuple[str, ...] = Field((), description="regular expressions; each match is replaced by [REDACTED] before anything is written")
    flush_s: float = Field(FLUSH_S, gt=0, le=60)
    segment_records: int = Field(256, ge=1)
    segment_mb: int = Field(4, ge=1, description="a new segment after this many MB: bounds what each flush rewrites")
    segment_s: float = Field(DEFAULT_SEGMENT_S, gt=0, le=86400, description="a new segment after this many seconds: an open segment holds retention back")
    keep_mb: float | None = Field(None, gt=0, allow_inf_nan=False, description="retention: delete the oldest segments past this many MB")
    keep_hours: float | None = Field(None, gt=0, allow_inf_nan=False, description="retention: delete segments last written more than this long ago")

    @model_validator(mode="after")
    def _keep_below_cap(self) -> CaptureConfig:
        if self.keep_mb is not None and self.keep_mb >= self.max_mb:
            raise ValueError(f"keep_mb {self.keep_mb:g} must be below max_mb {self.max_mb:g}: the cap would stop capture before retention deletes anything")
        return self

    @field_validator("redact")
    @classmethod
    def _compiles(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            if not p:
                raise ValueError("an empty pattern would match everywhere")
            try:
                c = re.compile(p)
            except re.error as e:
                raise ValueError(f"{p!r} is not a regular expression ({e})") from None
            if c.fullmatch(""):
                raise ValueError(f"{p!r} matches the empty string")
        return v

    @property
    def max_bytes(self) -> int:
        return int(self.max_mb * 1_000_000)

    def patterns(self) -> list[re.Pattern[str]]:
        return [re.compile(p) for p in self.redact]

    def to_env(self) -> str:
        return self.model_dump_json()


def capture_config(
    d: Path,
    max_mb: float = DEFAULT_MAX_MB,
    redact: Sequence[str] = (),
    keep_mb: float | None = None,
    keep_hours: float | None = None,
    segment_s: float = DEFAULT_SEGMENT_S,
) -> CaptureConfig:
    """The command line's capture options, checked: one UserError naming the option for each bad value.

    The directory must be a directory (or not exist yet) in a place this process may write; it is
    not created here (the serving processes create it with their first record)."""
    for p in redact:
        try:
            if not p:
                raise re.error("empty pattern (it would match everywhere)")
            c = re.compile(p)
        except re.error as e:
            raise UserError(
                "--capture-redact", f"{p!r} is not a regular expression ({e})", "pass a Python regular expression, e.g. 'sk-[A-Za-z0-9]{20,}'"
            ) from None
        if c.fullmatch(""):
            raise UserError(
                "--capture-redact",
                f"{p!r} matches the empty string (a pattern that can match nothing is a mistake, e.g. * for +)",
                "make it match at least one character, e.g. '\\d+' rather than '\\d*'",
            )
    if not (max_mb > 0 and math.isfinite(max_mb)):
        raise UserError("--capture-max-mb", f"{max_mb:g}: must be a number of MB more than 0", "the cap on the capture directory's segments")
    for name, v in (("--capture-keep-mb", keep_mb), ("--capture-keep-hours", keep_hours)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise UserError(name, f"{v:g}: must be a number more than 0", "retention deletes the oldest segments past it; leave it out to keep everything")
    if not (0 < segment_s <= 86400):
        raise UserError("--capture-segment-s", f"{segment_s:g}: must be a number of seconds in (0, 86400]", "how long a segment stays open, e.g. 300")
    if keep_mb is not None and keep_mb >= max_mb:
        raise UserError(
            "--capture-keep-mb",
            f"{keep_mb:g} is not below --capture-max-mb {max_mb:g}: the cap would stop capture before retention deletes anything",
            "keep fewer MB than the cap, or raise --capture-max-mb",
        )
    d = Path(d).absolute()
    check_capture_dir(d)
    return CaptureConfig(dir=d, max_mb=max_mb, redact=tuple(redact), keep_mb=keep_mb, keep_hours=keep_hours, segment_s=segment_s)


def check_capture_dir(d: Path) -> None:
    """A capture directory the serving processes can write, or a one-line UserError."""
    hint = "--capture takes a directory this user can write (it is created if missing)"
    if os.path.lexists(d) and not d.is_dir():
        raise UserError(d, "is not a directory", hint)
    p = d
    while not os.path.lexists(p):
        p = p.parent
    if not p.is_dir():
        raise UserError(d, f"cannot be created: {p} is not a directory", hint)
    if not os.access(p, os.W_OK | os.X_OK):
        try:
            ro = bool(os.statvfs(p).f_flag & os.ST_RDONLY)
        except OSError:
            ro = False
        raise UserError(d, f"not writable: {p} is on a read-only file system" if ro else f"not writable: permission denied in {p}", hint)


# Searching again inside each match costs about the match's length per start position: past this
# many matched characters per character of text (a pathological match such as a 100k-digit number
# under \d+), the rest of the text is redacted whole: more than the secret, never less.
_REDACT_WORK = 16


def redaction_spans(text: str, patterns: Sequence[re.Pattern[str]]) -> list[tuple[int, int]]:
    """The merged (start, end) spans of ``text`` matched by any pattern at any start position.

    ``re.sub`` alone leaks: its matches do not overlap, so a match starting inside an earlier one
    is never tried (two adjacent keys under ``sk-[A-Za-z0-9]{20,}``: the first match ends after the
    ``sk`` of the second, and ``-`` plus the second key's 32 characters no longer match), and a
    second pattern applied after the first sees ``[REDACTED]`` instead of the text it would have
    matched. Here every pattern runs on the original text and is searched again from the character
    after each match's start."""
    spans: list[tuple[int, int]] = []
    for p in patterns:
        pos, work, budget = 0, 0, _REDACT_WORK * len(text) + 100_000
        while pos <= len(text):
            m = p.search(text, pos)
            if m is None:
                break
            s, e = m.span()
            work += e - s + 1
            if work > budget:
                spans.append((s, len(text)))
                break
            if e > s:
                spans.append((s, e))
            pos = s + 1
    spans.sort()
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def redact(text: str, patterns: Sequence[re.Pattern[str]]) -> str:
    """``text`` with every span of ``redaction_spans`` replaced by one ``[REDACTED]``."""
    out, last = [], 0
    for s, e in redaction_spans(text, patterns):
        out += [text[last:s], REDACTED]
        last = e
    out.append(text[last:])
    return "".join(out)


def redact_joined(texts: Sequence[str], patterns: Sequence[re.Pattern[str]]) -> tuple[list[str], list[bool]]:
    """``redact`` of the texts' concatenation, cut back into the pieces (a span crossing a boundary
    leaves one ``[REDACTED]`` on each side of it), and which pieces a span touched. Each piece is
    searched on its own too: a pattern ending in ``\b`` matches at a prompt's end only there when the
    completion goes on with a word character."""
    bounds, at = [], 0
    for t in texts:
        bounds.append((at, at + len(t)))
        at += len(t)
    found = redaction_spans("".join(texts), patterns)
    for t, (a, _) in zip(texts, bounds, strict=True):
        found += [(s + a, e + a) for s, e in redaction_spans(t, patterns)]
    spans: list[tuple[int, int]] = []
    for s, e in sorted(found):
        if spans and s <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], e))
        else:
            spans.append((s, e))
    out, hit = [], []
    for t, (a, b) in zip(texts, bounds, strict=True):
        local = [(max(s, a) - a, min(e, b) - a) for s, e in spans if s < b and e > a]
        parts, last = [], 0
        for s, e in local:
            parts += [t[last:s], REDACTED]
            last = e
        parts.append(t[last:])
        out.append("".join(parts))
        hit.append(bool(local))
    return out, hit


def config_from_env(environ: Mapping[str, str] | None = None) -> CaptureConfig | None:
    """The capture settings ``serve``/``serve-dynamo`` passed down; None when capture is off."""
    raw = (os.environ if environ is None else environ).get(CAPTURE_ENV)
    if not raw:
        return None
    try:
        return CaptureConfig.model_validate_json(raw)
    except ValidationError as e:
        raise UserError(CAPTURE_ENV, f"not a capture configuration ({e.errors()[0]['msg']})", "set by `eagle3-trt serve --capture`; unset it") from None


def capture_env(cfg: CaptureConfig | None, env: dict[str, str]) -> dict[str, str]:
    """``env`` for a serving process: the capture settings when on, and none inherited when off."""
    env.pop(CAPTURE_ENV, None)
    if cfg is not None:
        env[CAPTURE_ENV] = cfg.to_env()
    return env


def chat_prefix(tokenizer: Any) -> str | None:
    """What every chat-templated prompt of this tokenizer starts with (BOS and the first role
    header), or None without a chat template: the common start of a user-only and a
    system+user conversation, when it is more than BOS alone."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        a = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
        b = tokenizer.apply_chat_template([{"role": "system", "content": "y"}, {"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    except Exception:
        return None
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    prefix = a[:n]
    bos = getattr(tokenizer, "bos_token", None) or ""
    return prefix if len(prefix) > len(bos) else None


def load_tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer  # local: heavy, and loaded on the capture thread only

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@dataclass(frozen=True)
class CaptureSource:
    """What every record of one serving process shares."""

    bundle_fingerprint: str
    model: str
    frontend: Literal["triton", "dynamo"]
    model_version: str | None = None


def served_acceptance(s: SpecStats) -> ServedAcceptance:
    """The acceptance a capture record keeps of a finished request's ``llm_api.spec_stats``."""
    return ServedAcceptance(
        speculative=s.speculative,
        draft_tokens=s.draft_tokens,
        accepted_draft_tokens=s.accepted_draft_tokens,
        target_forwards=s.target_forwards,
        completion_tokens=s.completion_tokens,
    )


@dataclass(frozen=True)
class _Finished:
    request_id: str
    time_unix: float
    prompt_ids: list[int]
    prompt_text: str | None
    output_ids: list[int]
    output_text: str | None
    finish_reason: str | None
    sampling: dict[str, Any]
    stats: SpecStats
    category: str | None


_CLOSE = object()


class Capturer:
    """Records finished requests off the request path; see the module docstring."""

    def __init__(
        self,
        cfg: CaptureConfig,
        source: CaptureSource,
        *,
        tokenizer: Callable[[], Any],
        warn: Callable[[str], None],
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.cfg = cfg
        self.source = source
        self._tokenizer_factory = tokenizer
        self._warn = warn
        self._patterns = cfg.patterns()
        self._q: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.stopped = False  # capture is off for good in this process (cap reached, or a failure)
        self.dropped = 0  # records lost to a full queue
        self.written = 0
        self.skipped = 0  # records that could not be built (reported once)
        self._tok: Any = None
        self._chat_prefix: str | None = None
        self._writer: SegmentWriter | None = None
        self._others = 0  # bytes of the directory's segments this process did not write
        self._unflushed = False
        # records queued but not written are held against other writers' retention (traffic_retention.Hold):
        # a record is stamped and queued under _stamp, so the queue is in time order and its head is the oldest
        self._stamp = threading.Lock()
        self._hold: Hold | None = None
        try:
            self._hold = Hold(make_dirs(Path(cfg.dir)), time.time())
        except Exception:
            pass  # the capture thread reports the directory when it cannot write there
        self._thread = threading.Thread(target=self._loop, name="eagle3-capture", daemon=True)
        self._thread.start()

    # -- the request path: never blocks, never raises --------------------------------------------
    def record(
        self,
        *,
        request_id: str | None,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        sampling: Mapping[str, Any],
        stats: SpecStats,
        prompt_text: str | None = None,
        output_text: str | None = None,
        finish_reason: str | None = None,
        category: str | None = None,
    ) -> None:
        if self.stopped:
            return
        try:
            with self._stamp:  # stamped and queued together: the queue stays in time order (_update_hold)
                self._q.put_nowait(
                    _Finished(
                        request_id or uuid.uuid4().hex,
                        time.time(),
                        list(prompt_ids),
                        prompt_text,
                        list(output_ids),
                        output_text,
                        finish_reason,
                        dict(sampling),
                        stats,
                        category,
                    )
                )
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                self._warn(f"capture: the writer is behind; records are being dropped (queue of {self._q.maxsize} full)")
        except Exception as e:  # capture must never fail a request
            self._skip(e)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and the open segment, then stop the thread."""
        while self._thread.is_alive():
            try:
                self._q.put(_CLOSE, timeout=0.5)
                break
            except queue.Full:
                continue
        self._thread.join(timeout_s)

    # -- the capture thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._tok = self._tokenizer_factory()
            self._chat_prefix = chat_prefix(self._tok)
            self._writer = SegmentWriter(
                self.cfg.dir, segment_records=self.cfg.segment_records, segment_bytes=self.cfg.segment_mb * 1_000_000, segment_s=self.cfg.segment_s
            )
            self._others = self._dir_bytes()
            self._writer.max_bytes = self.cfg.max_bytes - self._others
        except Exception as e:
            self._stop(f"capture off: cannot start writing to {self.cfg.dir} ({type(e).__name__}: {e}); serving continues")
        last = time.monotonic()
        while True:
            wait = None if self._writer is None or not self._unflushed else max(0.0, last + self.cfg.flush_s - time.monotonic())
            due = None if self._writer is None or self.stopped else self._writer.rotate_in()
            if due is not None:  # an idle writer still closes its segment on time (it holds retention back)
                wait = due if wait is None else min(wait, due)
            if self._hold is not None:  # and keeps its hold's time current (a stale one holds retention back)
                wait = self.cfg.flush_s if wait is None else min(wait, self.cfg.flush_s)
            try:
                item = self._q.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is _CLOSE:
                break
            if isinstance(item, _Finished) and not self.stopped:
                self._write(item)
            if self._writer is not None and not self.stopped and time.monotonic() - last >= self.cfg.flush_s:
                self._flush()
                last = time.monotonic()
            if self._writer is not None and not self.stopped:
                self._guard(self._writer.rotate_if_due)
            self._update_hold()
        if self._writer is not None and not self.stopped:  # a stopped capturer writes nothing more
            self._flush()
            self._guard(self._writer.close)
        if self._writer is not None:
            self._release_quietly()
        self._drop_hold()

    def _update_hold(self) -> None:
        """The hold's time: the queue's oldest record's, or now when it is empty (anything queued later is newer)."""
        if self._hold is None:
            return
        if self.stopped:  # nothing more is written: nothing is held
            self._drop_hold()
            return
        with self._stamp:
            head = self._q.queue[0] if self._q.qsize() else None
            floor = head.time_unix if isinstance(head, _Finished) else time.time()
        try:
            self._hold.update(floor)
        except OSError:
            pass

    def _drop_hold(self) -> None:
        if self._hold is not None:
            try:
                self._hold.release()
            except OSError:
                pass
            self._hold = None

    def _write(self, item: _Finished) -> None:
        assert self._writer is not None
        try:
            rec = self._build(item)
        except Exception as e:
            self._skip(e)
            return
        try:
            ok = self._writer.write(rec)
        except CaptureDirGone:
            self._stop(self._gone_message())
            return
        except Exception as e:
            self._stop(f"capture off: writing to {self.cfg.dir} failed ({type(e).__name__}: {e}); serving continues")
            return
        if not ok:
            self._flush()
            self._stop(
                f"capture stopped: {self.cfg.dir} reached --capture-max-mb {self.cfg.max_mb:g} "
                f"({(self._others + self._writer.bytes_written) / 1e6:.2f} MB of segments); serving continues, nothing more is captured"
            )
            return
        self.written += 1
        self._unflushed = True

    def _guard(self, step: Callable[[], None]) -> None:
        try:
            step()
        except CaptureDirGone:
            self._stop(self._gone_message())
        except Exception as e:
            self._stop(f"capture off: writing to {self.cfg.dir} failed ({type(e).__name__}: {e}); serving continues")

    def _release_quietly(self) -> None:
        """The open segment's lease given up, nothing written (a stopped capturer writes nothing more)."""
        assert self._writer is not None
        try:
            self._writer.release()
        except OSError:
            pass

    def _flush(self) -> None:
        assert self._writer is not None
        try:
            self._writer.flush()
            self._writer.refresh()
            self._unflushed = False
            if self.cfg.keep_mb is not None or self.cfg.keep_hours is not None:
                self._writer.retain(
                    keep_bytes=None if self.cfg.keep_mb is None else int(self.cfg.keep_mb * 1_000_000),
                    keep_age_s=None if self.cfg.keep_hours is None else self.cfg.keep_hours * 3600.0,
                )
            # The other writers' share, for the cap (all of this writer's bytes are on disk now).
            self._others = max(0, self._dir_bytes() - self._writer.bytes_written)
            self._writer.max_bytes = self.cfg.max_bytes - self._others
        except CaptureDirGone:
            self._stop(self._gone_message())
        except Exception as e:
            self._stop(f"capture off: writing to {self.cfg.dir} failed ({type(e).__name__}: {e}); serving continues")

    def _dir_bytes(self) -> int:
        n = 0
        for p in segments(self.cfg.dir):
            try:
                n += p.stat().st_size
            except FileNotFoundError:
                pass
        return n

    def _gone_message(self) -> str:
        return f"capture stopped: {self.cfg.dir} was deleted (or replaced); it stays deleted, nothing more is captured; serving continues"

    def _stop(self, message: str) -> None:
        if not self.stopped:
            self.stopped = True
            self._warn(message)

    def _skip(self, e: Exception) -> None:
        self.skipped += 1
        if self.skipped == 1:
            self._warn(f"capture: a record could not be built and was skipped ({type(e).__name__}: {e}); later ones are skipped silently")

    # -- building a record (capture thread) ------------------------------------------------------
    def _decode(self, ids: list[int], skip_special: bool) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False))

    def _encode(self, text: str, prompt: bool) -> list[int]:
        bos = getattr(self._tok, "bos_token", None)
        special = prompt and not (isinstance(bos, str) and bos and text.startswith(bos))
        return [int(i) for i in self._tok.encode(text, add_special_tokens=special)]

    def _redact(self, text: str) -> str:
        return redact(text, self._patterns)

    def _build(self, it: _Finished) -> TrafficRecord:
        prompt_ids, output_ids = it.prompt_ids, it.output_ids
        # text decoded when the front end has none (Dynamo): the prompt as the model saw it, special tokens included
        prompt_text = self._decode(prompt_ids, skip_special=False) if it.prompt_text is None else it.prompt_text
        output_text = self._decode(output_ids, skip_special=True) if it.output_text is None else it.output_text
        r1 = r2 = False
        if self._patterns:
            # prompt and output are one stream to the model: a key whose start ends the prompt and whose
            # rest the model wrote matches only across the boundary, so both sides are searched together,
            # as texts and as what their ids decode to
            (prompt_text, output_text), hit = redact_joined((prompt_text, output_text), self._patterns)
            raw = (self._decode(prompt_ids, skip_special=False), self._decode(output_ids, skip_special=False))
            _, raw_hit = redact_joined(raw, self._patterns)
            r1, r2 = hit[0] or raw_hit[0], hit[1] or raw_hit[1]
            # the ids of a side a match touched are re-encoded from its redacted text: ids cannot carry what the text hid
            if r1:
                prompt_ids = self._encode(prompt_text, True)
            if r2:
                output_ids = self._encode(output_text, False)
        # the client chose these two as well: stored redacted like the texts
        request_id = self._redact(it.request_id)
        category = None if it.category is None else self._redact(it.category)
        return TrafficRecord(
            request_id=request_id,
            time_unix=it.time_unix,
            bundle_fingerprint=self.source.bundle_fingerprint,
            model=self.source.model,
            model_version=self.source.model_version,
            frontend=self.source.frontend,
            chat=bool(self._chat_prefix and prompt_text.startswith(self._chat_prefix)),
            prompt_text=prompt_text,
            prompt_ids=prompt_ids,
            output_ids=output_ids,
            output_text=output_text,
            finish_reason=it.finish_reason,
            sampling=CapturedSampling(**it.sampling),
            acceptance=served_acceptance(it.stats),
            category=category,
            redacted=r1 or r2 or request_id != it.request_id or category != it.category,
        )
