"""The one prompt loader: calibration (quantize), acceptance (alpha, compile) and the rollout benchmark.

Two file kinds, chosen by the suffix so a file is read one way from its first line to its last:

- ``.jsonl`` / ``.ndjson`` / ``.json``: one JSON object per line, each one of
  ``{"turns": ["user message", ...]}`` (the MT-Bench layout; ``category`` and ``question_id`` /
  ``id`` are kept), ``{"messages": [{"role": ..., "content": ...}, ...]}`` (its user messages
  are the turns), ``{"prompt": "..."}`` or ``{"text": "..."}`` (one turn). Keys are tried in that
  order; other keys are ignored.
- anything else: plain text, one prompt a line, the line kept as written.

Blank lines are skipped. A line that is not one of these is a UserError naming ``file:line``,
never a silently dropped record: a calibration set or an acceptance measurement that quietly
lost prompts would still produce numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from eagle3_trt.errors import UserError

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
# The shipped prompt set (MT-Bench layout, 8 categories): calibration default and the compile smoke test.
SHIPPED_PROMPTS = Path(__file__).resolve().parent / "data" / "calib_prompts.jsonl"
FORMAT_HINT = ('one JSON object per line with "turns" (list of user messages), "messages" ([{role, content}]), '
               '"prompt" or "text"; or a plain-text file with one prompt a line')


@dataclass(frozen=True)
class PromptRecord:
    """One conversation's user turns. ``id``: ``question_id``/``id`` or the line number."""

    id: str
    category: str
    turns: tuple[str, ...]

    @property
    def first(self) -> str:
        return self.turns[0]


def _turns(obj: dict, where: str) -> list[str]:
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UserError(where, '"turns" is not a non-empty list of non-empty strings', FORMAT_HINT)
        return turns
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs):
            raise UserError(where, '"messages" is not a list of {role: str, content: str}', FORMAT_HINT)
        turns = [m["content"] for m in msgs if m["role"] == "user" and m["content"].strip()]
        if not turns:
            raise UserError(where, '"messages" has no non-empty user message', FORMAT_HINT)
        return turns
    for key in ("prompt", "text"):
        if key in obj:
            if not isinstance(obj[key], str) or not obj[key].strip():
                raise UserError(where, f'"{key}" is not a non-empty string', FORMAT_HINT)
            return [obj[key]]
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
    out: list[PromptRecord] = []
    for n, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        if not jsonl:
            out.append(PromptRecord(str(n), "all", (line,)))
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(where, f"not valid JSON ({e.msg})", FORMAT_HINT) from None
        if not isinstance(obj, dict):
            raise UserError(where, f"expected a JSON object, got {type(obj).__name__}", FORMAT_HINT)
        turns = _turns(obj, where)
        rid = obj.get("question_id", obj.get("id"))
        out.append(PromptRecord(str(n if rid is None else rid), str(obj.get("category") or "all"), tuple(turns)))
    if not out:
        raise UserError(path, "no prompts in the file", FORMAT_HINT)
    return out


def load_prompts(path: str | Path, limit: int | None = None, *, option: str = "--prompts") -> list[str]:
    """The first turn of each of the first ``limit`` records (single-turn uses: calibration, benchmarks)."""
    return [r.first for r in load_prompt_records(path, limit, option=option)]
