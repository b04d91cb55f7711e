"""The reference runtime called directly on a prompt text: the oracle server tests compare with."""

from __future__ import annotations

from typing import Any

from eagle3_trt.core.engine import SamplingParams


def direct_generate(engine: Any, text: str, max_tokens: int, speculate: bool = True) -> tuple[str, int, str | None, Any]:
    """(text, token count, finish reason, final stats) of greedy decoding of ``text`` by ``engine``
    (``runtime.loader.engine_from_bundle``), BOS added unless the text already starts with it."""
    bos = engine.tokenizer.bos_token
    ids = engine.tokenizer.encode(text, add_special_tokens=not text.startswith(bos))
    toks: list[int] = []
    reason, stats = None, None
    for step in engine.stream(ids, SamplingParams(max_tokens=max_tokens), speculate=speculate):
        toks += step.new_token_ids
        reason, stats = step.finish_reason, step.stats
    out = engine.tokenizer.decode(toks, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return out, len(toks), reason, stats


__all__ = ["direct_generate"]
