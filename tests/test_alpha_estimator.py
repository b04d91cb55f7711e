"""The fast greedy alpha estimator reproduces speculative generation exactly; broken drafts are caught.

The draft of the embedded tiny pair is distilled onto the tiny target for a few seconds in the
fixture (a random draft accepts nothing, which would make every comparison vacuous). The target's
layers are "sharpened" first (see ``testing.toy_pair.sharpen_target``) so that its hidden states carry
context and the draft has to use them: otherwise wrong aux layers could not lower alpha.
Prompts are half from the distillation set and half unseen.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
import torch

from eagle3_trt.convert.load import load_engine
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.core.stats import aggregate
from eagle3_trt.measure.diagnostics import diagnose_sequences
from eagle3_trt.measure.estimator import estimate
from eagle3_trt.testing.tiny_pair import make_draft, make_pair
from eagle3_trt.testing.toy_pair import sharpen_target
from eagle3_trt.train.trainer import distill_draft

FIELDS = (
    "draft_tokens",
    "accepted_tokens",
    "target_forwards",
    "generated_tokens",
    "drafted_per_position",
    "reached_per_position",
    "accepted_per_position",
    "accept_hist",
)


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[0] + [rng.randrange(6, 512) for _ in range(rng.randrange(3, 14))] for _ in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    t, d = make_pair(tmp_path_factory.mktemp("pair"))
    eng = load_engine(t, d, dtype=torch.float32, max_draft_len=3)
    sharpen_target(eng.target)
    train = _prompts(11, 256)
    distill_draft(eng, train, steps=200, lr=5e-3, gen_tokens=24)
    return eng, train[:6] + _prompts(12, 6)


@pytest.fixture(scope="module")
def hidden_only(tmp_path_factory, setup):
    """A second draft on the same target that predicts from the target's aux states only."""
    eng, _ = setup
    t, d = make_pair(tmp_path_factory.mktemp("pair2"))
    fresh = load_engine(t, d, dtype=torch.float32, max_draft_len=3)
    h = SpeculativeEngine(
        eng.target, fresh.draft, eng.tokenizer, max_draft_len=3, eos_token_ids=eng.eos_token_ids, max_seq_len=eng.max_seq_len, pad_token_id=eng.pad_token_id
    )
    distill_draft(h, _prompts(11, 256), steps=200, lr=5e-3, gen_tokens=24, hidden_only=True)
    return h


def _stats_tuple(s):
    return tuple(getattr(s, f) for f in FIELDS)


@pytest.mark.parametrize("k,max_tokens", [(3, 32), (1, 20), (5, 32), (3, 4)])
def test_estimator_counts_identical_to_speculative_generation(setup, k, max_tokens):
    eng, prompts = setup
    eng.max_draft_len = k
    try:
        est = estimate(eng, prompts, max_tokens=max_tokens, batch_size=5)
        gen = [eng.generate([p], SamplingParams(max_tokens=max_tokens))[0] for p in prompts]
        batched = eng.generate(prompts, SamplingParams(max_tokens=max_tokens))
    finally:
        eng.max_draft_len = 3
    for e, g, b, c in zip(est.stats, gen, batched, est.continuations):
        assert g.token_ids == c == b.token_ids
        assert _stats_tuple(e) == _stats_tuple(g.stats) == _stats_tuple(b.stats)
    agg = aggregate(est.stats)
    if max_tokens > 4:
        assert 0.2 < agg.alpha < 0.95  # both accepted and rejected drafts occur


def test_sweep_replays_every_draft_length_exactly(setup):
    """One continuation and one K_max drafting pass give each K's counts, as separate runs at that K do."""
    eng, prompts = setup
    est = estimate(eng, prompts, max_tokens=24, k=3, sweep=(1, 2, 5))
    assert sorted(est.by_k) == [1, 2, 3, 5] and est.stats is est.by_k[3]
    for k in (1, 2, 5):
        eng.max_draft_len = k
        try:
            gen = eng.generate(prompts, SamplingParams(max_tokens=24))
        finally:
            eng.max_draft_len = 3
        for e, g in zip(est.by_k[k], gen):
            assert _stats_tuple(e) == _stats_tuple(g.stats)
    als = [aggregate(est.by_k[k]).acceptance_length for k in (1, 2, 3, 5)]
    assert als == sorted(als) and als[0] < als[-1]  # longer chains accept more per target pass here


def test_estimator_identical_on_prompts_of_very_different_lengths(setup):
    """Several prefill groups, a merged left-padded cache and per-length attention windows."""
    eng, prompts = setup
    rng = random.Random(5)
    mixed = prompts[:3] + [[0] + [rng.randrange(6, 512) for _ in range(n)] for n in (40, 90, 150, 151, 260)]
    est = estimate(eng, mixed, max_tokens=24, batch_size=8)
    for p, e, c in zip(mixed, est.stats, est.continuations):
        g = eng.generate([p], SamplingParams(max_tokens=24))[0]
        assert g.token_ids == c
        assert _stats_tuple(e) == _stats_tuple(g.stats)


def test_estimator_with_stop_tokens(setup):
    eng, prompts = setup
    ref = eng.generate(prompts, SamplingParams(max_tokens=32), speculate=False)
    stop = ref[0].token_ids[6]  # a token the target emits mid-continuation
    saved = eng.eos_token_ids
    eng.eos_token_ids = saved + (stop,)
    try:
        est = estimate(eng, prompts, max_tokens=32)
        gen = [eng.generate([p], SamplingParams(max_tokens=32))[0] for p in prompts]
    finally:
        eng.eos_token_ids = saved
    assert any(g.finish_reason == "stop" for g in gen)
    for e, g in zip(est.stats, gen):
        assert _stats_tuple(e) == _stats_tuple(g.stats)


def _greedy_seqs(eng, prompts):
    res = eng.generate(prompts, SamplingParams(max_tokens=32), speculate=False)
    return [p + r.token_ids for p, r in zip(prompts, res)], [len(p) for p in prompts]


def _checks(eng, seqs, lens) -> dict[str, dict]:
    return {c["check"]: c for c in diagnose_sequences(eng, seqs, lens)}


@contextmanager
def _shuffled_d2t(eng, seed: int = 0):
    """The same set of target ids, assigned to the wrong draft ids."""
    d2t = eng.draft.d2t.clone()
    ids = torch.arange(d2t.numel()) + d2t
    g = torch.Generator().manual_seed(seed)
    eng.draft.d2t.copy_(ids[torch.randperm(ids.numel(), generator=g)] - torch.arange(d2t.numel()))
    eng._d2t_ids = torch.arange(d2t.numel()) + eng.draft.d2t
    try:
        yield
    finally:
        eng.draft.d2t.copy_(d2t)
        eng._d2t_ids = ids


@contextmanager
def _flat_head(eng, scale: float):
    """The draft's lm_head scaled down: the same top-1 everywhere, a much flatter distribution
    (like a healthy large-vocabulary head: right 71-77% of the time at top-1 probability 0.13)."""
    w = eng.draft.lm_head.weight.data.clone()
    eng.draft.lm_head.weight.data.mul_(scale)
    try:
        yield
    finally:
        eng.draft.lm_head.weight.data.copy_(w)


def test_shuffled_d2t_lowers_alpha_and_diagnostics_say_why(setup):
    eng, _ = setup
    prompts = _prompts(13, 12)  # unseen: the draft has to generalize from the target's hidden states
    good = aggregate(estimate(eng, prompts, max_tokens=32).stats).alpha
    assert good > 0.4
    seqs, lens = _greedy_seqs(eng, prompts)
    healthy = _checks(eng, seqs, lens)
    assert all(c["ok"] for c in healthy.values()), healthy
    assert healthy["draft_agreement"]["value"] > 0.5 and len(healthy["draft_agreement"]["per_position"]) == 3
    with _shuffled_d2t(eng):
        shuffled = aggregate(estimate(eng, prompts, max_tokens=32).stats).alpha
        diag = _checks(eng, seqs, lens)
    assert shuffled < good / 3, (good, shuffled)
    assert not diag["d2t"]["ok"] and "d2t does not match" in diag["d2t"]["detail"], diag["d2t"]
    # the agreement flag is up too, and points at the named cause
    assert not diag["draft_agreement"]["ok"] and "explained by d2t" in diag["draft_agreement"]["detail"]


def test_flat_but_agreeing_draft_is_not_flagged_and_a_shuffled_d2t_is_still_named(setup):
    eng, _ = setup
    seqs, lens = _greedy_seqs(eng, _prompts(14, 12))
    healthy = _checks(eng, seqs, lens)
    with _flat_head(eng, 0.15):
        flat = _checks(eng, seqs, lens)
        with _shuffled_d2t(eng, seed=1):
            flat_shuffled = _checks(eng, seqs, lens)
    conf = flat["draft_confidence"]
    assert conf["value"] < 0.13 < healthy["draft_confidence"]["value"], (conf, healthy["draft_confidence"])
    assert flat["draft_agreement"]["per_position"] == healthy["draft_agreement"]["per_position"]  # same top-1
    assert flat["draft_agreement"]["value"] > 0.5
    assert all(c["ok"] for c in flat.values()), flat  # no PROBLEM line for a flat head that agrees
    assert conf.get("info") and "flat" in conf["detail"]
    # the d2t verdict does not wait for the confidence (or agreement) verdict
    assert not flat_shuffled["d2t"]["ok"] and "d2t does not match" in flat_shuffled["d2t"]["detail"], flat_shuffled["d2t"]
    assert flat_shuffled["d2t"]["oracle"] > flat_shuffled["d2t"]["null_oracle"] + 0.15


def test_random_draft_is_flagged_by_agreement_and_not_blamed_on_d2t(setup, tmp_path):
    eng, _ = setup
    seqs, lens = _greedy_seqs(eng, _prompts(13, 12))
    t, d = make_pair(tmp_path / "pair")
    make_draft(d, seed=3)  # an untrained head, not the one the fixture distilled
    fresh = load_engine(t, d, dtype=torch.float32, max_draft_len=3)
    rnd = SpeculativeEngine(
        eng.target, fresh.draft, eng.tokenizer, max_draft_len=3, eos_token_ids=eng.eos_token_ids, max_seq_len=eng.max_seq_len, pad_token_id=eng.pad_token_id
    )
    diag = _checks(rnd, seqs, lens)
    assert not diag["draft_agreement"]["ok"] and diag["draft_agreement"]["value"] < 0.05, diag["draft_agreement"]
    assert "untrained, random" in diag["draft_agreement"]["detail"]
    # its top-1 is a hash of states that encode the next token: relabeling it does no better than a random read-out
    assert diag["d2t"]["ok"], diag["d2t"]


def test_wrong_aux_layers_lower_alpha_and_diagnostics_say_why(hidden_only):
    # A draft that leans on the target's hidden states, like real drafts do (a toy draft with token
    # inputs learns the tiny target's loops from tokens alone and hardly notices the aux layers).
    # Measured at K = 1, where alpha is the draft's step-1 acceptance, the direct read-out of fc.
    eng = hidden_only
    prompts = _prompts(13, 12) + _prompts(14, 12)
    good = aggregate(estimate(eng, prompts, max_tokens=32, k=1).stats).alpha
    res = eng.generate(prompts, SamplingParams(max_tokens=32), speculate=False)
    seqs, lens = [p + r.token_ids for p, r in zip(prompts, res)], [len(p) for p in prompts]
    assert {c["check"]: c for c in diagnose_sequences(eng, seqs, lens)}["aux_layers"]["ok"]
    assert eng.target.aux_layer_ids == (1, 3, 4)  # what the draft was trained on, in that order
    # ~750 drafted positions: a drop of 0.05 is several standard errors of alpha
    for wrong_ids, min_drop in (((4, 3, 1), 0.05), ((5, 6, 7), 0.1)):  # wrong order; layers of another depth
        eng.target.aux_layer_ids = wrong_ids
        try:
            wrong = aggregate(estimate(eng, prompts, max_tokens=32, k=1).stats).alpha
            diag = {c["check"]: c for c in diagnose_sequences(eng, seqs, lens)}
        finally:
            eng.target.aux_layer_ids = (1, 3, 4)
        assert wrong < good - min_drop, (wrong_ids, good, wrong)
        assert not diag["aux_layers"]["ok"] and "[1, 3, 4]" in diag["aux_layers"]["detail"], diag["aux_layers"]
