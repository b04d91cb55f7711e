"""Where speculation stops paying by context length (measure/switch_off.py), on synthetic reports whose
acceptance is known: short contexts accept every draft, long ones none. The costs are an 8B FP8 target
with a BF16 head on an H100 (KV read per context token, so a long context costs more per step)."""

from __future__ import annotations

import pytest

from eagle3_trt.measure.context_buckets import context_tables
from eagle3_trt.measure.switch_off import NO_CONTEXT_SETTING, context_switch_off

K = 3
MAX_TOKENS = 64
MAX_SEQ_LEN = 8192
COSTS = dict(
    gpu="h100",
    target_bytes=8e9,
    draft_bytes=0.5e9,
    target_format="fp8",
    draft_format="bf16",
    target_kv_bytes_per_token=65536.0,  # 32 layers x 8 KV heads x 128 x (K, V) x FP8
    draft_kv_bytes_per_token=2048.0,
    target_layers=32,
    hidden=4096,
)


def _request(i: int, prompt: int, accepted: int) -> dict:
    """A request whose every verification accepts ``accepted`` of K drafts, run to MAX_TOKENS."""
    seq, g = [], 1
    while g < MAX_TOKENS:
        kk = min(K, MAX_TOKENS - g - 1)
        if kk == 0:
            g += 1
            continue
        a = min(accepted, kk)
        seq.append(a)
        g += a + 1
    gen = min(g, MAX_TOKENS)
    return {"id": str(i), "turn": 1, "category": "x", "prompt_tokens": prompt, "generated_tokens": gen, "accepted_seq": seq}


def _report(requests: list[dict]) -> dict:
    return {
        "settings": {"max_tokens": MAX_TOKENS, "max_draft_len": K, "prompts": "synthetic"},
        "pairs": {"bundle": {"requests": requests, "overall": {"cumulative_acceptance": [0.5, 0.25, 0.125]}}},
        "acceptance_by_context": context_tables(requests, K, MAX_TOKENS, MAX_SEQ_LEN),
    }


def test_stops_paying_after_the_bucket_where_acceptance_collapses_and_says_no_setting_acts_on_length():
    short = [_request(i, 200, 3) for i in range(12)]  # AL 4 in 0-512
    mid = [_request(100 + i, 1500, 2) for i in range(12)]  # AL 3 in 1k-2k
    long = [_request(200 + i, 2600, 0) for i in range(12)]  # AL 1 in 2k-3k: below any break-even
    ev = context_switch_off(_report(short + mid + long), K, 8, COSTS)
    by = {b["bucket"]: b for b in ev["buckets"]}
    assert by["0-512"]["pays"] and by["1k-2k"]["pays"] and not by["2k-3k"]["pays"]
    assert by["2k-3k"]["acceptance_length"] == pytest.approx(1.0)
    assert by["2k-3k"]["break_even_al"] > 1.0
    assert by["2k-3k"]["mean_context"] > 2600 and by["0-512"]["mean_context"] < 512  # priced at each bucket's own context
    assert ev["stops_paying_at"] == 2048
    assert any("stops paying past 2048 tokens of context" in line for line in ev["lines"])
    assert ev["lines"].count(NO_CONTEXT_SETTING) == 1
    # the switch-off would turn speculation off for the short requests too: replayed, it does not help
    assert not ev["written"]
    assert any(line.startswith("closest setting not written") for line in ev["lines"])
    assert "window" not in ev and ev["switch_off_replay"]["by_window"]


def test_pays_everywhere_gives_one_line_and_nothing_to_write():
    ev = context_switch_off(_report([_request(i, 200 + 300 * i, 3) for i in range(10)]), K, 8, COSTS)
    assert ev["stops_paying_at"] is None and not ev["written"]
    assert "pays in every measured context bucket" in ev["lines"][0] and ev["lines"][2] == NO_CONTEXT_SETTING
    assert not any(line.startswith("closest setting") for line in ev["lines"])  # nothing to switch off


def test_switch_off_is_written_when_the_replay_shows_it_saves_time():
    # every request is long and accepts nothing: speculation never pays, the rate gate trips at once and saves time
    ev = context_switch_off(_report([_request(i, 2600, 0) for i in range(8)] + [_request(50, 2600, 1)]), K, 8, COSTS)
    assert ev["stops_paying_at"] == 2048  # the lowest measured bucket's lower edge
    assert "does not pay in any measured context bucket" in ev["lines"][0]
    assert ev["written"] and ev["window"] in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    assert 0.0 < ev["threshold"] < 1.0
    best = ev["switch_off_replay"]["by_window"][str(ev["window"])]
    assert best["mean_saved"] > 0.01 and best["ci95"][0] > 0
    assert any(line.startswith("closest setting: acceptance_rate_window_size") for line in ev["lines"])


def test_a_report_without_the_section_says_so_in_one_line():
    rep = _report([_request(0, 200, 3)])
    del rep["acceptance_by_context"]
    ev = context_switch_off(rep, K, 8, COSTS)
    assert not ev["written"] and ev["lines"] == ["acceptance by context: the alpha report holds none (measure it again with this version)"]
