"""Speculative sampling follows the target's own sampling distribution.

Setup: a random Llama with a 16-token vocabulary, peaked enough that the distribution matters,
and a random EAGLE-3 draft whose 12-token vocabulary misses 4 target tokens (so q = 0 where
p > 0 and the residual resampling is exercised). 4000 requests sample 4 tokens each with K = 2;
tokens 2 and 3 come out of the first speculative iteration (accepted drafts, residual resamples
or the bonus token), and the joint distribution of tokens 1-3 is tested.
Reference: the exact joint distribution of the 3 tokens, enumerated with transformers' own
forward and its logits warpers (temperature, top-k, top-p), not with the runtime's code.

Test: Pearson chi-square over the 16^3 outcomes, cells with an expected count < 5 pooled;
tolerance: p-value > 1e-3 (fixed seeds, so the outcome is deterministic). The same statistic
must reject a slightly different temperature (p < 1e-6), which shows the test has power at
this sample size.
"""

from __future__ import annotations

import pytest
import torch

from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.testing.spec_sampling_check import chi2_p as _chi2_pvalue
from eagle3_trt.testing.spec_sampling_check import exact_joint as _exact_joint
from eagle3_trt.testing.toy_pair import toy_engine

V, DV, N_SAMPLES, PROMPT = 16, 12, 4000, [1, 2, 3]


@pytest.fixture(scope="module")
def pair():
    return toy_engine(V, DV, max_draft_len=2, seed=0)


def _sample_counts(eng, params: SamplingParams, speculate: bool):
    res = eng.generate([PROMPT] * N_SAMPLES, params, speculate=speculate)
    counts = torch.zeros(V, V, V)
    for r in res:
        assert len(r.token_ids) == 4
        counts[tuple(r.token_ids[:3])] += 1
    acc = sum(r.stats.accepted_tokens for r in res)
    drafted = sum(r.stats.draft_tokens for r in res)
    return counts, acc, drafted


@pytest.mark.parametrize(
    "temperature,top_k,top_p,speculate",
    [
        (1.0, 0, 1.0, True),
        (0.8, 6, 0.9, True),
        (1.0, 0, 1.0, False),
    ],
)
def test_speculative_samples_follow_target_distribution(pair, temperature, top_k, top_p, speculate):
    hf, eng = pair
    params = SamplingParams(max_tokens=4, temperature=temperature, top_k=top_k, top_p=top_p, seed=1234)
    counts, acc, drafted = _sample_counts(eng, params, speculate)
    exact = _exact_joint(hf, temperature, top_k, top_p)
    assert abs(float(exact.sum()) - 1) < 1e-4
    p = _chi2_pvalue(counts, exact)
    assert p > 1e-3, f"chi-square p-value {p:.2e}: samples do not follow the target distribution"
    if speculate:
        # both branches of the rejection rule ran many times
        assert drafted >= 2 * N_SAMPLES and 0.1 * drafted < acc < 0.9 * drafted, (acc, drafted)
    # power: the same samples are clearly not from a nearby temperature
    other = _exact_joint(hf, temperature * 1.25, top_k, top_p)
    assert _chi2_pvalue(counts, other) < 1e-6


def test_seeded_sampling_is_reproducible(pair):
    _, eng = pair
    a = eng.generate([PROMPT] * 8, SamplingParams(max_tokens=6, temperature=1.0, seed=5))
    b = eng.generate([PROMPT] * 8, SamplingParams(max_tokens=6, temperature=1.0, seed=5))
    c = eng.generate([PROMPT] * 8, SamplingParams(max_tokens=6, temperature=1.0, seed=6))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    assert len({tuple(r.token_ids) for r in a}) > 1  # request i uses seed + i
    (s,) = eng.generate([PROMPT], SamplingParams(max_tokens=6, temperature=1.0, seed=5))
    assert s.token_ids == a[0].token_ids
