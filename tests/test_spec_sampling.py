"""Temperature > 0 under speculation, for each combination of TensorRT-LLM's sampling flags
(core/spec_sampling.py: allow_advanced_sampling, use_rejection_sampling, advanced_sampling_mode).

Setup: the toy pair of test_runtime_sampling (16-token target vocabulary, 12-token draft
vocabulary, K = 2). N requests sample 4 tokens each; tokens 2 and 3 come out of the first
speculative iteration, and the joint distribution of tokens 1-3 is compared with the exact
target-only distribution, enumerated with transformers' forward and logits warpers (not with the
runtime's code). Pearson chi-square over the 16^3 outcomes, cells expecting < 5 pooled
(eagle3_trt/testing/spec_sampling_check.py, which also prints the table).

Where TensorRT-LLM's output follows the target (allow_advanced_sampling on, mode full; or a mode
whose skipped filter the request does not set): p > 1e-3. Where it does not (flags off: greedy;
a mode that drops a filter the request sets): p < 1e-6 against the request's distribution, and the
samples do follow what is served instead (greedy output / the distribution without that filter).
"""

from __future__ import annotations

import pytest

from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.core.spec_sampling import REJECTION_SAMPLING, SpecSamplingConfig
from eagle3_trt.errors import UserError
from eagle3_trt.testing.spec_sampling_check import PROMPT, V, chi2_p, exact_joint, sample_counts
from eagle3_trt.testing.toy_pair import toy_engine

N = 3000


@pytest.fixture(scope="module")
def pair():
    hf, eng = toy_engine(V, 12, max_draft_len=2, seed=0)
    yield hf, eng
    eng.sampling = REJECTION_SAMPLING


def _run(eng, flags: SpecSamplingConfig, params: SamplingParams):
    return sample_counts(eng, flags, params, N)


MATCH = SpecSamplingConfig(allow_advanced_sampling=True)


@pytest.mark.parametrize(
    "flags,temperature,top_k,top_p",
    [
        (MATCH, 1.0, 0, 1.0),
        (MATCH, 0.8, 6, 0.9),
        (REJECTION_SAMPLING, 0.8, 6, 0.9),
        # the mode skips top_k, but this request sets none: still its own distribution
        (SpecSamplingConfig(allow_advanced_sampling=True, advanced_sampling_mode="no_topk"), 0.9, 0, 0.85),
    ],
    ids=["match-T1", "match-topk-topp", "rejection-topk-topp", "no_topk-request-without-top_k"],
)
def test_exact_combinations_follow_the_target(pair, flags, temperature, top_k, top_p):
    hf, eng = pair
    assert flags.inexact_reason(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)) is None
    counts, acc, drafted = _run(eng, flags, SamplingParams(max_tokens=4, temperature=temperature, top_k=top_k, top_p=top_p, seed=99))
    exact = exact_joint(hf, temperature, top_k, top_p)
    p = chi2_p(counts, exact)
    assert p > 1e-3, f"chi-square p-value {p:.2e}: speculative samples do not follow the target"
    assert drafted >= 2 * N and 0.05 * drafted < acc < 0.95 * drafted, (acc, drafted)  # both outcomes of verification ran
    # power at this sample size: a nearby temperature is rejected
    assert chi2_p(counts, exact_joint(hf, temperature * 1.25, top_k, top_p)) < 1e-6


def test_flags_off_serve_greedy_not_the_target(pair):
    """TensorRT-LLM's defaults (allow_advanced_sampling off): temperature is ignored while speculating."""
    hf, eng = pair
    off = SpecSamplingConfig()
    assert off.served == "greedy" and "allow_advanced_sampling" in (off.warning() or "")
    counts, _, _ = _run(eng, off, SamplingParams(max_tokens=4, temperature=1.0, seed=7))
    assert chi2_p(counts, exact_joint(hf, 1.0, 0, 1.0)) < 1e-6  # detected: not the target's sampling
    (greedy,) = eng.generate([list(PROMPT)], SamplingParams(max_tokens=4), speculate=False)
    assert counts[tuple(greedy.token_ids[:3])] == N  # every request got the target's greedy output
    # without speculation the same request samples as the target does
    eng.sampling = off
    res = eng.generate([list(PROMPT)] * 64, SamplingParams(max_tokens=3, temperature=1.0, seed=7), speculate=False)
    assert len({tuple(r.token_ids) for r in res}) > 1


def test_mode_dropping_a_requested_filter_is_detected(pair):
    """advanced_sampling_mode no_topk with a top_k request: served without top_k."""
    hf, eng = pair
    flags = SpecSamplingConfig(allow_advanced_sampling=True, use_rejection_sampling=True, advanced_sampling_mode="no_topk")
    params = SamplingParams(max_tokens=4, temperature=1.0, top_k=3, seed=11)
    assert "top_k" in (flags.inexact_reason(params) or "")
    counts, _, _ = _run(eng, flags, params)
    assert chi2_p(counts, exact_joint(hf, 1.0, 3, 1.0)) < 1e-6  # detected
    assert chi2_p(counts, exact_joint(hf, 1.0, 0, 1.0)) > 1e-3  # what is served: temperature only


def test_flag_validation_and_warnings():
    with pytest.raises(UserError, match="advanced_sampling_mode"):
        SpecSamplingConfig(allow_advanced_sampling=True, advanced_sampling_mode="no_top_k")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="use_rejection_sampling"):
        SpecSamplingConfig(use_rejection_sampling=True)
    assert MATCH.warning() is None and REJECTION_SAMPLING.warning() is None
    w = SpecSamplingConfig(allow_advanced_sampling=True, advanced_sampling_mode="no_topk_no_topp").warning()
    assert w is not None and "top_k and top_p" in w and "\n" not in w
    greedy = SamplingParams(temperature=0.0)
    assert SpecSamplingConfig().inexact_reason(greedy) is None and SpecSamplingConfig().served_params(greedy) is greedy
