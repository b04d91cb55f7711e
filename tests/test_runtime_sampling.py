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


def test_mt19937_seeding_matches_the_reference_init_by_array():
    """core/sampling seeds torch's CPU generator from both halves of a 64-bit seed with mt19937's
    ``init_by_array``; numpy's legacy RandomState seeds from an array the same way (an independent
    implementation of the reference algorithm)."""
    import numpy as np

    from eagle3_trt.core.sampling import _mt_init_by_array

    for key in ([1, 1], [0, 256], [0xFFFFFFFF, 0xFFFFFFFF]):
        want = np.random.RandomState(np.array(key, dtype=np.uint32)).get_state()[1]
        assert np.array_equal(np.array(_mt_init_by_array(key), dtype=np.uint32), want)


def test_64_bit_seeds_are_honoured(pair):
    """TensorRT-LLM's seed is a uint64; torch's CPU mt19937 keeps 32 bits of manual_seed, so seeds 1,
    2**32 + 1 and 2**40 + 1 used to draw identical samples. Each is its own stream now, and repeats."""
    _, eng = pair
    seeds = (1, 2**32 + 1, 2**40 + 1, 2**64 - 1)

    def run(seed: int) -> tuple[int, ...]:
        (r,) = eng.generate([list(PROMPT)], SamplingParams(max_tokens=24, temperature=1.0, seed=seed), speculate=True)
        return tuple(r.token_ids)

    outs = [run(s) for s in seeds]
    assert len(set(outs)) == len(seeds), outs
    assert [run(s) for s in seeds] == outs
    g1 = torch.Generator().manual_seed(1)  # seeds below 2**32 keep manual_seed's stream
    from eagle3_trt.core.sampling import seeded_generator

    assert torch.equal(torch.rand(4, generator=seeded_generator(1, "cpu")), torch.rand(4, generator=g1))


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_out_of_range_seed_is_refused(seed):
    from eagle3_trt.errors import UserError

    with pytest.raises(UserError, match="seed.*64-bit unsigned integer"):
        SamplingParams(max_tokens=4, temperature=1.0, seed=seed)
