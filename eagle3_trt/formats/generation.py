"""The special-token ids a model directory declares for generation: where decoding stops, what pads.

One reader for every consumer (the reference engine's loader, ``ReferenceLLM``, validate's draft
check), so a stop id found by one is found by all. A model names its end-of-sequence ids in three
places, and all three count: ``generation_config.json`` (Llama 3 lists end of text and end of turn
there), ``config.json``, and the tokenizer's ``eos_token`` in ``tokenizer_config.json`` (text; its
id is an added token of ``tokenizer.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_trt.formats.checkpoint_io import read_json


def eos_ids_of(value: Any) -> tuple[Any, ...]:
    """A config's ``eos_token_id`` field (one id, a list of ids, or absent) as a tuple of its ids."""
    if isinstance(value, list):
        return tuple(value)
    return (value,) if value is not None else ()


def token_text(value: Any) -> str | None:
    """The text of a special token in ``tokenizer_config.json``: a string, or a serialized
    ``AddedToken`` (a dict with ``content``); None for anything else."""
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def eos_token_ids(*model_dirs: Path) -> tuple[int, ...]:
    """Every end-of-sequence id the directories declare, in the order found, without repeats."""
    ids: list[int] = []
    for d in map(Path, model_dirs):
        for name in ("generation_config.json", "config.json"):
            if (d / name).is_file():
                ids += (int(i) for i in eos_ids_of(read_json(d / name).get("eos_token_id")))
        tc, tj = d / "tokenizer_config.json", d / "tokenizer.json"
        if tc.is_file() and tj.is_file():
            eos = token_text(read_json(tc).get("eos_token"))
            added = {t["content"]: t["id"] for t in read_json(tj).get("added_tokens", [])}
            if eos in added:
                ids.append(int(added[eos]))
    return tuple(dict.fromkeys(ids))


def pad_token_id(model_dir: Path) -> int:
    """``config.json``'s ``pad_token_id``; 0 where it names none (rows padded with it are masked)."""
    f = Path(model_dir) / "config.json"
    if f.is_file():
        v = read_json(f).get("pad_token_id")
        if isinstance(v, int):
            return v
    return 0
