"""The one prompt loader (convert/prompts.py): every accepted layout, and a file:line UserError for each bad line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_trt.convert.prompts import (
    CHAT,
    LINE,
    RAW,
    SHIPPED_PROMPTS,
    PromptRecord,
    load_prompt_records,
    load_prompts,
    use_chat_template,
)
from eagle3_trt.errors import UserError

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _jsonl(tmp_path: Path, *rows, name: str = "p.jsonl") -> Path:
    f = tmp_path / name
    f.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return f


def test_every_jsonl_layout(tmp_path):
    f = _jsonl(
        tmp_path,
        {"question_id": 81, "category": "writing", "turns": ["one", "two"]},
        "",
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "three"},
                {"role": "assistant", "content": "reply"},
                {"role": "user", "content": "four"},
            ]
        },
        {"prompt": "five", "text": "not this"},
        {"id": "x", "text": "six"},
    )
    recs = load_prompt_records(f)
    assert recs == [
        PromptRecord("81", "writing", ("one", "two")),
        PromptRecord("3", "all", ("three", "four")),  # no id: the line number
        PromptRecord("4", "all", ("five",), RAW),  # raw completion text, no chat template
        PromptRecord("x", "all", ("six",), RAW),
    ]
    assert [r.kind for r in recs] == [CHAT, CHAT, RAW, RAW]
    assert load_prompts(f) == ["one", "three", "five", "six"]
    assert load_prompts(f, 2) == ["one", "three"]


def test_plain_text_keeps_each_line_as_written(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text('first prompt \n\n{"turns": ["not parsed"]}\n')
    assert load_prompts(f) == ["first prompt ", '{"turns": ["not parsed"]}']
    assert {r.kind for r in load_prompt_records(f)} == {LINE}


def test_chat_template_per_record_kind(tmp_path):
    f = _jsonl(tmp_path, {"turns": ["chat"]}, {"text": "def f(x):\n    return"}, {"prompt": "import os"})
    recs = load_prompt_records(f)
    assert use_chat_template(recs, None) == [True, False, False]  # by kind: chat templated, raw records as they are
    assert use_chat_template(recs, True) == [True, True, True]  # --chat-template: every record as a user turn
    lines = tmp_path / "p.txt"
    lines.write_text("one\ntwo\n")
    line_recs = load_prompt_records(lines)
    assert use_chat_template(line_recs, None) == [True, True] and use_chat_template(line_recs, False) == [False, False]
    raw_only = load_prompt_records(_jsonl(tmp_path, {"text": "a"}, name="raw.jsonl"))
    assert use_chat_template(raw_only, False) == [False]
    # a chat record has no raw form: one line naming the file, the record and the way out
    with pytest.raises(UserError, match=r"p\.jsonl: record 1 is a chat record .*--no-chat-template cannot send raw") as e:
        use_chat_template(recs, False, source=f)
    assert "\n" not in e.value.line() and '{"text": ...}' in e.value.line()


@pytest.mark.parametrize(
    "line, what",
    [
        ("plain words", "not valid JSON"),
        ('["a list"]', "expected a JSON object, got list"),
        ('{"category": "x"}', 'no "turns", "messages", "prompt" or "text"'),
        ('{"turns": []}', '"turns" is not a non-empty list'),
        ('{"turns": ["ok", "  "]}', '"turns" is not a non-empty list'),
        ('{"turns": "a string"}', '"turns" is not a non-empty list'),
        ('{"messages": [{"role": "user"}]}', '"messages" is not a list of {role: str, content: str}'),
        ('{"messages": [{"role": "assistant", "content": "only a reply"}]}', "no non-empty user message"),
        ('{"prompt": 3}', '"prompt" is not a non-empty string'),
        ('{"text": ""}', '"text" is not a non-empty string'),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, line, what):
    f = _jsonl(tmp_path, {"turns": ["fine"]}, line)
    with pytest.raises(UserError) as e:
        load_prompt_records(f)
    msg = str(e.value)
    assert f"{f}:2" in msg and what in msg and "\n" not in msg


def test_file_level_errors(tmp_path):
    with pytest.raises(UserError, match="prompt file not found.*--calib"):
        load_prompts(tmp_path / "missing.jsonl", option="--calib")
    empty = _jsonl(tmp_path, "", "  ")
    with pytest.raises(UserError, match="no prompts in the file"):
        load_prompts(empty)
    with pytest.raises(UserError, match="asks for 0 prompts"):
        load_prompts(_jsonl(tmp_path, {"text": "a"}), 0)
    latin1 = tmp_path / "l.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        load_prompts(latin1)


def test_shipped_set_is_mt_bench_layout():
    recs = load_prompt_records(SHIPPED_PROMPTS)
    assert len(recs) >= 16 and len({r.category for r in recs}) > 1
    if (SHARED / "data" / "mt_bench.jsonl").is_file():
        assert len(load_prompts(SHARED / "data" / "mt_bench.jsonl")) == 80


def test_heldout_file_gives_token_id_records(tmp_path):
    """A held-out prompts file (what an embedded pair ships) is read as token ids, measured as
    stored: never templated, never sent as text; a bad one names its field."""
    from eagle3_trt.convert.prompts import IDS

    f = Path(__file__).resolve().parents[1] / "models" / "tiny" / "heldout_prompts.json"
    held = json.loads(f.read_text())["prompts"]
    recs = load_prompt_records(f, 8)
    assert [r.ids for r in recs] == [tuple(p) for p in held[:8]] and {r.kind for r in recs} == {IDS}
    assert len(load_prompt_records(f)) == len(held)
    assert use_chat_template(recs, None) == use_chat_template(recs, False) == [False] * 8
    with pytest.raises(UserError, match="token ids, which cannot go through a chat template"):
        use_chat_template(recs, True)
    with pytest.raises(UserError, match=r"holds token ids \(a held-out prompts file\), not text \(hint: pass --calib"):
        load_prompts(f, option="--calib")
    bad = _jsonl(tmp_path, {"about": "x", "prompts": [[1, 2], []]}, name="h.json")
    with pytest.raises(UserError, match=r"h\.json:prompts\[1\]: is empty"):
        load_prompt_records(bad)
    # a one-record JSON file of another layout is still read as JSONL
    assert load_prompt_records(_jsonl(tmp_path, {"prompt": "x"}, name="one.json"))[0].kind == RAW
