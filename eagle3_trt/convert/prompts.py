"""The one prompt loader: calibration (quantize), acceptance (alpha, compile) and the rollout benchmark.

Two file kinds, chosen by the suffix so a file is read one way from its first line to its last:

- ``.jsonl`` / ``.ndjson`` / ``.json``: one JSON object per line, each one of
  ``{"turns": ["user message", ...]}`` (the MT-Bench layout; ``category`` and ``question_id`` /
  ``id`` are kept) or ``{"messages": [{"role": ..., "content": ...}, ...]}`` (its user messages
  are the turns): a *chat* record, sent through the chat template; ``{"prompt": "..."}`` or
  ``{"text": "..."}``: a *raw completion* record, the text sent as it is (an OpenAI
  ``/v1/completions`` prompt), for code completion and other non-chat traffic. Keys are tried
  in that order; other keys are ignored.
- anything else: plain text, one prompt a line, the line kept as written: a user turn by
  default, raw text with ``--no-chat-template``.
- a held-out prompts file (``{"about": ..., "prompts": [[token ids], ...]}``, what an embedded
  pair ships as heldout_prompts.json; formats/heldout.py): *token-id* records, measured exactly
  as stored (no template, no tokenizer), so ``alpha --prompts models/tiny/heldout_prompts.json``
  reruns the build's own acceptance check. Only measurements take them: text users
  (calibration, benchmarks: ``load_prompts``) refuse the file in one line.

How a record is encoded (``use_chat_template``): chat records always through the template (a
chat record cannot be sent raw: ``--no-chat-template`` refuses it), raw records never unless
``--chat-template`` forces it, plain-text lines by the flag (template by default).

Blank lines are skipped. A line that is not one of these is a UserError naming ``file:line``,
never a silently dropped record: a calibration set or an acceptance measurement that quietly
lost prompts would still produce numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from eagle3_trt.errors import UserError
from eagle3_trt.formats.heldout import read_heldout_file
from eagle3_trt.resources import data_dir

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
# The shipped prompt set (MT-Bench layout, 8 categories): calibration default and the compile smoke test.
SHIPPED_PROMPTS = data_dir("convert") / "data" / "calib_prompts.jsonl"
CHAT, RAW, LINE, IDS = "chat", "raw", "line", "ids"  # PromptRecord.kind: turns/messages, prompt/text, a plain-text line, token ids
FORMAT_HINT = (
    'one JSON object per line with "turns" (list of user messages), "messages" ([{role, content}]), '
    '"prompt" or "text" (raw completion text); or a plain-text file with one prompt a line'
)


@dataclass(frozen=True)
class PromptRecord:
    """One conversation's user turns (a raw record: its one text). ``id``: ``question_id``/``id``
    or the line number. ``kind``: CHAT ("turns"/"messages"), RAW ("prompt"/"text"), LINE (a
    plain-text file's line) or IDS (a held-out file's prompt: ``ids`` holds it, ``turns`` one
    empty turn so multi-turn loops count it once)."""

    id: str
    category: str
    turns: tuple[str, ...]
    kind: str = CHAT
    ids: tuple[int, ...] = ()

    @property
    def first(self) -> str:
        return self.turns[0]


def _turns(obj: dict, where: str) -> tuple[list[str], str]:
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UserError(where, '"turns" is not a non-empty list of non-empty strings', FORMAT_HINT)
        return turns, CHAT
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs):
            raise UserError(where, '"messages" is not a list of {role: str, content: str}', FORMAT_HINT)
        turns = [m["content"] for m in msgs if m["role"] == "user" and m["content"].strip()]
        if not turns:
            raise UserError(where, '"messages" has no non-empty user message', FORMAT_HINT)
        return turns, CHAT
    for key in ("prompt", "text"):
        if key in obj:
            if not isinstance(obj[key], str) or not obj[key].strip():
                raise UserError(where, f'"{key}" is not a non-empty string', FORMAT_HINT)
            return [obj[key]], RAW
    raise UserError(where, 'no "turns", "messages", "prompt" or "text"', FORMAT_HINT)


def load_prompt_records(path: str | Path, limit: int | None = None, *, option: str = "--prompts") -> list[PromptRecord]:
    """The first ``limit`` records (all when None) of a prompt file; ``option`` names the CLI flag in hints."""
    path = Path(path)
    if limit is not None and limit < 1:
        raise UserError(option, f"asks for {limit} prompts", "ask for at least 1")
    if not path.is_file():
        raise UserError(path, "prompt file not found", f"pass {option} FILE: {FORMAT_HINT}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(path, f"not UTF-8 text ({e.reason} at byte {e.start})", FORMAT_HINT) from None
    jsonl = path.suffix.lower() in JSONL_SUFFIXES
    if jsonl and _is_heldout_file(lines):
        ids = read_heldout_file(path).prompts[:limit]
        if not ids:
            raise UserError(path, "no prompts in the file", FORMAT_HINT)
        return [PromptRecord(str(n), "heldout", ("",), IDS, tuple(p)) for n, p in enumerate(ids, 1)]
    out: list[PromptRecord] = []
    for n, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        if not jsonl:
            out.append(PromptRecord(str(n), "all", (line,), LINE))
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(where, f"not valid JSON ({e.msg})", FORMAT_HINT) from None
        if not isinstance(obj, dict):
            raise UserError(where, f"expected a JSON object, got {type(obj).__name__}", FORMAT_HINT)
        turns, kind = _turns(obj, where)
        rid = obj.get("question_id", obj.get("id"))
        out.append(PromptRecord(str(n if rid is None else rid), str(obj.get("category") or "all"), tuple(turns), kind))
    if not out:
        raise UserError(path, "no prompts in the file", FORMAT_HINT)
    return out


def _is_heldout_file(lines: list[str]) -> bool:
    """The whole file is one JSON object with "prompts" (a held-out file, not one JSONL record)."""
    try:
        obj = json.loads("\n".join(lines))
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "prompts" in obj


def use_chat_template(
    records: list[PromptRecord], chat_template: bool | None, *, source: str | Path = "prompts", option: str = "--no-chat-template"
) -> list[bool]:
    """Per record: encode through the chat template? ``chat_template``: None (each record by its
    kind), True (every record, raw ones as one user turn) or False (raw text; chat records are
    refused, a conversation has no raw form). Token-id records are never templated (they are
    measured as stored; --chat-template refuses them). Checked before any model is loaded."""
    ids = next((r for r in records if r.kind == IDS), None)
    if chat_template and ids is not None:
        raise UserError(source, f"record {ids.id} is token ids, which cannot go through a chat template", "drop --chat-template")
    if chat_template is False:
        chat = next((r for r in records if r.kind == CHAT), None)
        if chat is not None:
            raise UserError(
                source,
                f'record {chat.id} is a chat record ("turns"/"messages"), which {option} cannot send raw',
                f'use {{"text": ...}} or {{"prompt": ...}} records (or a plain-text file) for raw completion traffic, or drop {option}',
            )
        return [False] * len(records)
    if chat_template:
        return [True] * len(records)
    return [r.kind not in (RAW, IDS) for r in records]


def load_prompts(path: str | Path, limit: int | None = None, *, option: str = "--prompts") -> list[str]:
    """The first turn of each of the first ``limit`` records (single-turn uses: calibration, benchmarks)."""
    records = load_prompt_records(path, limit, option=option)
    if records and records[0].kind == IDS:
        raise UserError(path, "holds token ids (a held-out prompts file), not text", f"pass {option} a text prompt file: {FORMAT_HINT}")
    return [r.first for r in records]


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation ending with the assistant's turn header (the bundle's chat template)."""
    if tokenizer is None:
        raise UserError("tokenizer", "the bundle has no tokenizer", "rebuild the bundle; it ships tokenizer/")
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    # no template: drafts lose much acceptance without the format they were trained on; say so in the report
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def encode_raw(tokenizer, text: str) -> list[int]:
    """Token ids of a raw completion prompt, as TensorRT-LLM's OpenAI server encodes one: no
    template, special tokens (BOS) as the tokenizer adds them by default
    (NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py: ``CompletionRequest.add_special_tokens``
    defaults to True, passed to the input processor's ``tokenizer.encode``; chat requests default
    to False because the template carries BOS)."""
    if tokenizer is None:
        raise UserError("tokenizer", "the bundle has no tokenizer", "rebuild the bundle; it ships tokenizer/")
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def first_turn_ids(records: list[PromptRecord], tokenizer, vocab_size: int, *, source: str | Path) -> list[list[int]]:
    """Token ids of each record's first turn as a measurement sends it: chat records through the
    template, raw records as completions, token-id records as stored (``use_chat_template``'s defaults)."""
    templated = use_chat_template(records, None, source=source)
    out = []
    for rec, chat in zip(records, templated):
        if rec.kind == IDS:
            ids = list(rec.ids)
            if max(ids, default=0) >= vocab_size:
                raise UserError(
                    f"{source}: prompt {rec.id}",
                    f"token id {max(ids)} is outside the target's vocabulary of {vocab_size}",
                    "these ids belong to another tokenizer",
                )
        else:
            ids = encode_chat(tokenizer, [{"role": "user", "content": rec.first}]) if chat else encode_raw(tokenizer, rec.first)
        out.append(ids)
    return out
