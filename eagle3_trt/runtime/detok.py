"""Incremental detokenization and stop strings for streamed output.

Streaming sends text as it is produced, so two things must not leak into a response:
half of a multi-byte character (byte-level BPE splits UTF-8 across tokens), and the first
characters of a stop string that is about to complete.
"""

from __future__ import annotations

import contextlib


class IncrementalDetokenizer:
    """Decode a growing id list a window at a time (cost per step independent of length)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True, lock=None):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self.ids: list[int] = []
        self._prefix = 0  # start of the window re-decoded for context
        self._read = 0  # ids already turned into text

    def _decode(self, ids: list[int]) -> str:
        with self._lock:
            return self._tok.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False)

    def add(self, new_ids) -> str:
        self.ids.extend(int(i) for i in new_ids)
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            delta = text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.ids)
            return delta
        return ""

    def holding(self) -> bool:
        """Ids not yet turned into text (an incomplete character at the end)."""
        return self._read < len(self.ids)

    def mark(self) -> tuple[int, int, int]:
        return len(self.ids), self._prefix, self._read

    def reset(self, mark: tuple[int, int, int]) -> None:
        """Back to ``mark()``: the ids added since are forgotten."""
        n, self._prefix, self._read = mark
        del self.ids[n:]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        if self._read == len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return text[len(prefix_text) :]


class StopMatcher:
    """Hold back text that may be the start of a stop string; cut at the first full match."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._pending = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Text safe to emit now; after a match, ``matched`` is set and nothing more is emitted."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buf = self._pending + text
        first = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, s)
        if first is not None:
            self.matched = first[1]
            self._pending = ""
            return buf[: first[0]]
        cut = max(0, len(buf) - self._hold)
        self._pending = buf[cut:]
        return buf[:cut]

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return "" if self.matched is not None else out

    def mark(self) -> tuple[str, str | None]:
        return self._pending, self.matched

    def reset(self, mark: tuple[str, str | None]) -> None:
        self._pending, self.matched = mark


def detokenize_step(detok: IncrementalDetokenizer, stops: StopMatcher, ids: list[int]) -> tuple[int, str]:
    """One decoding step's tokens -> (how many of them to keep, the text safe to send now).

    The step is decoded at once (two tokenizer calls per step, not per token). When stop
    strings are set and that text completes one, or part of the step is held back (half a
    character at its end), the step is replayed token by token, the rule that finds the exact
    token completing a stop string: the tokens after it are not returned (``ReferenceLLM`` trims
    them), and the kept count is what feeding one token at a time gives."""
    if not stops.stops:
        return len(ids), detok.add(ids)
    before = detok.mark(), stops.mark()
    text = stops.feed(detok.add(ids))
    if stops.matched is None and not detok.holding():
        return len(ids), text
    detok.reset(before[0])
    stops.reset(before[1])
    text = ""
    for n, tok in enumerate(ids, 1):
        text += stops.feed(detok.add([tok]))
        if stops.matched is not None:
            return n, text
    return len(ids), text
