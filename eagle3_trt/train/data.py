"""Training text for a draft head: records from JSONL or plain text, tokenized into fixed windows.

A record is either raw ``text`` or a chat (``turns``: user prompts, or ``messages``: role/content
dicts). Records are split into a training part and a held-out part *before* tokenization, so
that held-out prompts never share a document with the text the head was trained on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_trt.core import hf_compat
from eagle3_trt.errors import UserError

FORMAT_HINT = 'expected JSONL lines with "text", "turns" (list of user prompts) or "messages" ([{role, content}]), or a plain .txt file'


@dataclass(frozen=True)
class Record:
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def prompts_only(self) -> bool:
        return self.messages is not None and all(r != "assistant" for r, _ in self.messages)


@dataclass
class Window:
    """One training sequence: token ids (no padding) and the prompt it can be evaluated from."""

    ids: list[int]
    prompt: list[int] = field(default_factory=list)
    from_text: bool = True  # raw text (a --generate run replaces it by prompt + the target's continuation)


def _record_from_obj(obj: object, where: str) -> Record | None:
    if not isinstance(obj, dict):
        raise UserError(where, f"expected a JSON object, got {type(obj).__name__}", FORMAT_HINT)
    if isinstance(obj.get("text"), str):
        return Record(text=obj["text"]) if obj["text"].strip() else None
    if isinstance(obj.get("messages"), list):
        msgs = []
        for m in obj["messages"]:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise UserError(where, "a message is not {role: str, content: str}", FORMAT_HINT)
            if m["content"].strip():
                msgs.append((m["role"], m["content"]))
        return Record(messages=tuple(msgs)) if msgs else None
    if isinstance(obj.get("turns"), list):
        turns = [t for t in obj["turns"] if isinstance(t, str) and t.strip()]
        return Record(messages=tuple(("user", t) for t in turns)) if turns else None
    return None


def _split_plain_text(text: str, chars_per_record: int) -> list[Record]:
    """Cut one long text at blank lines into records of about chars_per_record characters."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    out: list[Record] = []
    cur: list[str] = []
    size = 0
    for b in blocks:
        cur.append(b)
        size += len(b) + 2
        if size >= chars_per_record:
            out.append(Record(text="\n\n".join(cur)))
            cur, size = [], 0
    if cur:
        out.append(Record(text="\n\n".join(cur)))
    return out


def load_records(path: Path, chars_per_record: int = 4000) -> list[Record]:
    """Records of a .jsonl/.json-lines file or a plain text file; UserError when none is usable."""
    path = Path(path)
    if not path.is_file():
        raise UserError(path, "data file not found", FORMAT_HINT)
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(path, f"not UTF-8 text ({e.reason} at byte {e.start})", FORMAT_HINT) from None
    records: list[Record] = []
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{n}", f"not valid JSON ({e.msg})", FORMAT_HINT) from None
            rec = _record_from_obj(obj, f"{path}:{n}")
            if rec is not None:
                records.append(rec)
    else:
        records = _split_plain_text(raw, chars_per_record)
    if not records:
        raise UserError(path, "no usable text (every record is empty or has none of text/turns/messages)", FORMAT_HINT)
    return records


def split_records(records: list[Record], eval_fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
    """(train, held-out) at record level; with a single record the held-out part is empty
    (the caller then holds out windows instead)."""
    if len(records) < 2 or eval_fraction <= 0:
        return list(records), []
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_eval = min(len(records) - 1, max(1, round(eval_fraction * len(records))))
    held = sorted(order[:n_eval])
    keep = sorted(order[n_eval:])
    return [records[i] for i in keep], [records[i] for i in held]


class Encoder:
    """Tokenizes records the way the target sees them (its chat template for chats)."""

    def __init__(self, tokenizer, seq_len: int, prompt_len: int = 64):
        self.tok = tokenizer
        # Whole documents are encoded and then cut into windows; silence the per-call length warning.
        tokenizer.model_max_length = 1 << 40
        self.seq_len = seq_len
        self.prompt_len = prompt_len
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        self.bos = tokenizer.bos_token_id

    def chat_ids(self, messages: list[tuple[str, str]], add_generation_prompt: bool) -> list[int]:
        if self.has_template:
            return hf_compat.chat_template_ids(self.tok, [{"role": r, "content": c} for r, c in messages], add_generation_prompt)
        text = "\n\n".join(c for _, c in messages) + ("\n\n" if add_generation_prompt else "")
        return self.text_ids(text)

    def text_ids(self, text: str) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False)
        return ([self.bos] if self.bos is not None else []) + list(ids)

    def windows(self, rec: Record, generate: Callable[[list[int]], list[int]] | None = None) -> list[Window]:
        """Token windows of at most seq_len for one record; chats run through `generate` when given."""
        if rec.is_chat:
            msgs = list(rec.messages or ())
            prompt = self.chat_ids(msgs[:1], add_generation_prompt=True)
            if generate is not None and rec.prompts_only:
                conv: list[tuple[str, str]] = []
                for _, turn in msgs:
                    conv.append(("user", turn))
                    reply = generate(self.chat_ids(conv, add_generation_prompt=True))
                    conv.append(("assistant", self.tok.decode(reply, skip_special_tokens=True)))
                msgs = conv
            ids = self.chat_ids(msgs, add_generation_prompt=False)
        else:
            ids = self.text_ids(rec.text or "")
            prompt = ids[: self.prompt_len]
        out = []
        for start in range(0, len(ids), self.seq_len):
            chunk = ids[start : start + self.seq_len]
            if len(chunk) >= 2:
                out.append(Window(ids=chunk, prompt=prompt if start == 0 else chunk[: self.prompt_len], from_text=not rec.is_chat))
        return out


def eval_prompts(windows: list[Window], n: int, prompt_len: int, seed: int) -> list[list[int]]:
    """Up to n distinct held-out prompts (each at most prompt_len tokens, at least 2)."""
    seen: set[tuple[int, ...]] = set()
    out: list[list[int]] = []
    order = list(range(len(windows)))
    random.Random(seed).shuffle(order)
    for i in order:
        p = tuple(windows[i].prompt[:prompt_len])
        if len(p) >= 2 and p not in seen:
            seen.add(p)
            out.append(list(p))
        if len(out) >= n:
            break
    return out
