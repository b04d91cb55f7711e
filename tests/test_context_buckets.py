"""Acceptance by context length (measure/context_buckets.py): each verification's context and counts
rebuilt from a request's accepted-per-verification list, on a hand-worked request, and checked
against the estimator's own per-request counts on the embedded pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.measure.context_buckets import DEFAULT_EDGES, Step, bucket_labels, bucket_of, check_edges, context_tables, request_steps


def test_steps_of_a_hand_worked_request():
    # prompt 10 tokens, K=3, max_tokens 9: the prefill emits token 1 (g=1); then
    # g=1: drafts min(3, 9-1-1)=3, accepts 2, emits 3, context 11 -> g=4
    # g=4: drafts 3, accepts 0, emits 1, context 14 -> g=5
    # g=5: drafts min(3, 9-5-1)=3, accepts 2, emits 3, context 15 -> g=8
    # g=8: drafts min(3, 9-8-1)=0 (nothing to verify), emits 1, context 18 -> g=9 = max_tokens
    steps = request_steps(10, 9, [2, 0, 2], k=3, max_tokens=9, max_seq_len=100)
    assert steps == [Step(11, 3, 2, 3, 3), Step(14, 3, 0, 1, 1), Step(15, 3, 2, 3, 3), Step(18, 0, 0, 0, 1)]


def test_a_stop_token_among_the_accepted_ends_without_a_bonus_token():
    # generated 6: after the prefill (g=1) accepts 2 (+1) -> g=4, then accepts 2 with the stop token second: emits 2 only
    steps = request_steps(5, 6, [2, 2], k=3, max_tokens=64, max_seq_len=100)
    assert steps == [Step(6, 3, 2, 3, 3), Step(9, 3, 2, 2, 2)]


def test_max_seq_len_shortens_the_draft():
    # prompt 90, max_seq_len 96: at g=1 the draft is min(3, 96-91-1)=3; at g=4, min(3, 96-94-1)=1
    steps = request_steps(90, 5, [2, 0], k=3, max_tokens=64, max_seq_len=96)
    assert [(s.context, s.drafted) for s in steps] == [(91, 3), (94, 1)]


def test_a_sequence_that_does_not_fit_the_rule_is_not_rebuilt():
    assert request_steps(10, 9, [2, 0], k=3, max_tokens=9, max_seq_len=100) is None  # too few verifications
    assert request_steps(10, 9, [2, 0, 2, 1], k=3, max_tokens=9, max_seq_len=100) is None  # too many
    assert request_steps(10, 9, [4, 0, 2], k=3, max_tokens=9, max_seq_len=100) is None  # more accepted than drafted


def test_buckets_and_labels():
    assert bucket_labels((512, 1024, 2048, 3072, 4096)) == ["0-512", "512-1k", "1k-2k", "2k-3k", "3k-4k", "4k+"]
    assert bucket_labels(DEFAULT_EDGES)[-2:] == ["64k-128k", "128k+"]
    assert [bucket_of(c, (512, 1024)) for c in (0, 511, 512, 1023, 1024, 9999)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(UserError):
        check_edges((512, 512))


def test_tables_of_the_hand_worked_request():
    req = {"id": "a", "turn": 1, "prompt_tokens": 10, "generated_tokens": 9, "accepted_seq": [2, 0, 2]}
    t = context_tables([req], k=3, max_tokens=9, max_seq_len=100, edges=(12, 16))
    rows = {r["bucket"]: r for r in t["by_context"]["rows"]}
    # contexts 11 | 14, 15 | 18
    assert rows["0-12"]["forwards"] == 1 and rows["0-12"]["tokens"] == 3 and rows["0-12"]["alpha"] == pytest.approx(2 / 3)
    assert rows["12-16"]["forwards"] == 2 and rows["12-16"]["acceptance_length"] == pytest.approx(2.0)
    assert rows["12-16"]["alpha"] == pytest.approx(2 / 6)
    assert rows["12-16"]["cumulative_acceptance"] == pytest.approx([0.5, 0.5, 0.0])  # positions reached 2,1,1; accepted 1,1,0
    assert rows["16+"]["forwards"] == 1 and rows["16+"]["draft_tokens"] == 0 and rows["16+"]["acceptance_length"] == 1.0
    # by prompt length: the whole request sits in its prompt's bucket
    (only,) = t["by_prompt_length"]["rows"]
    assert only["bucket"] == "0-12" and only["forwards"] == 4 and only["tokens"] == 8 and only["accepted_tokens"] == 4
    assert t["by_context"]["unmatched"] == []


MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny"


def test_rebuilt_steps_add_up_to_the_estimators_counts():
    """On the embedded pair, every request's rebuilt steps give back the estimator's own counts:
    forwards, tokens, drafted, accepted and the per-position lists, with prompts long enough that
    max_seq_len shortens drafts and max_tokens ends runs."""
    import torch

    from eagle3_trt.convert.load import load_engine
    from eagle3_trt.core.stats import aggregate
    from eagle3_trt.measure.estimator import estimate

    eng = load_engine(MODEL / "target", MODEL / "draft", dtype=torch.float32, max_draft_len=3)
    held = json.loads((MODEL / "heldout_prompts.json").read_text())["prompts"]
    prompts = [held[0][:40], held[1][:20], held[2] * 30][:3]
    prompts[2] = prompts[2][: eng.max_seq_len - 12]  # near the end of the context: drafts shortened
    est = estimate(eng, prompts, max_tokens=24, k=3)
    reqs = [
        {"id": str(i), "turn": 1, "prompt_tokens": len(p), "generated_tokens": s.generated_tokens, "accepted_seq": s.accepted_seq}
        for i, (p, s) in enumerate(zip(prompts, est.stats))
    ]
    for r, s in zip(reqs, est.stats):
        steps = request_steps(r["prompt_tokens"], s.generated_tokens, s.accepted_seq, 3, 24, eng.max_seq_len)
        assert steps is not None
        assert len(steps) + 1 == s.target_forwards
        assert sum(x.tokens for x in steps) + 1 == s.generated_tokens
        assert sum(x.drafted for x in steps) == s.draft_tokens and sum(x.accepted for x in steps) == s.accepted_tokens
    assert any(x.drafted < 3 for x in request_steps(reqs[2]["prompt_tokens"], est.stats[2].generated_tokens, est.stats[2].accepted_seq, 3, 24, eng.max_seq_len))
    t = context_tables(reqs, k=3, max_tokens=24, max_seq_len=eng.max_seq_len, edges=(64, 512))
    agg = aggregate(est.stats)
    rows = t["by_context"]["rows"]
    assert sum(r["accepted_tokens"] for r in rows) == agg.accepted_tokens
    assert sum(r["draft_tokens"] for r in rows) == agg.draft_tokens
    assert sum(r["forwards"] for r in rows) == agg.target_forwards - len(prompts)
