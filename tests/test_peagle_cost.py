"""The P-EAGLE cost hook (speculative/peagle/cost.py) against the EAGLE-3 chain's (measure/cost_model.py
``predict``), on the same roofline (an 8B BF16 target and a one-layer head on an H100), and the release
table (speculative/peagle/serving.py)."""

from __future__ import annotations

import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.measure.cost_model import CostParams, expected_tokens, forward_time_s, model_cost, predict
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.speculative.peagle import cost
from eagle3_trt.speculative.peagle.serving import serving_table, vllm_speculative_config

GPU = get_gpu("h100")
P = CostParams()
TARGET = model_cost(16e9, "bf16", GPU, 1, kv_bytes_per_token=131072, layers=32, hidden=4096)
DRAFT = model_cost(0.9e9, "bf16", GPU, 1, kv_bytes_per_token=4096)
CUM = [0.8, 0.6, 0.45, 0.33]  # cumulative per-position acceptance, K = 4


def _peagle(batch: int, k: int, cum: list[float]) -> tuple[float, float]:
    """(P-EAGLE's predicted speedup, its draft seconds per iteration) at this batch."""
    ctx = batch * P.context_len
    base = forward_time_s(TARGET, GPU, batch, ctx, 1, P, P.target_step_overhead_us)[0]
    verify = forward_time_s(TARGET, GPU, batch * (k + 1), ctx, 1, P, P.target_step_overhead_us)[0]

    def fwd(tokens: float) -> float:
        return forward_time_s(DRAFT, GPU, tokens, ctx, 1, P, P.draft_step_overhead_us)[0]

    e = expected_tokens(cum, k)
    return cost.speedup(base, verify, fwd, batch, e, k), cost.draft_seconds(fwd, batch, e, k)


def test_one_draft_forward_for_k_tokens():
    """Memory-bound at batch 1: P-EAGLE's draft time is ONE forward (over E+K-1 tokens), the chain's K."""
    e = expected_tokens(CUM, 4)
    _, d = _peagle(1, 4, CUM)
    one = forward_time_s(DRAFT, GPU, e + 3, P.context_len, 1, P, P.draft_step_overhead_us)[0]
    assert d == pytest.approx(one)
    chain = predict(CUM, GPU, TARGET, DRAFT, 1, 1, 4, P)
    pe, _ = _peagle(1, 4, CUM)
    assert pe > chain.speedup  # same acceptance, K-1 fewer draft forwards
    # the chain's draft time is K forwards (one over E tokens, K-1 over one); P-EAGLE's is the one above
    single = forward_time_s(DRAFT, GPU, 1, P.context_len, 1, P, P.draft_step_overhead_us)[0]
    first = forward_time_s(DRAFT, GPU, e, P.context_len, 1, P, P.draft_step_overhead_us)[0]
    verify = forward_time_s(TARGET, GPU, 5, P.context_len, 1, P, P.target_step_overhead_us)[0]
    assert chain.t_spec_us * 1e-6 == pytest.approx(verify + first + 3 * single)
    assert cost.iteration_seconds(verify, lambda n: forward_time_s(DRAFT, GPU, n, P.context_len, 1, P, P.draft_step_overhead_us)[0], 1, e, 4) == pytest.approx(
        verify + d
    )
    assert d < first + 3 * single


def test_lower_acceptance_can_lose():
    """P-EAGLE's mask slots are usually accepted less than the chain's autoregressive drafts: at batch 1 it
    wins with the same acceptance but loses when its later positions are accepted much less."""
    weak = [0.8, 0.3, 0.1, 0.03]
    chain = predict(CUM, GPU, TARGET, DRAFT, 1, 1, 4, P).speedup
    assert _peagle(1, 4, weak)[0] < chain < _peagle(1, 4, CUM)[0]


def test_release_table():
    spec = vllm_speculative_config("$BUNDLE/draft", 5)
    assert spec == {"method": "eagle3", "model": "$BUNDLE/draft", "num_speculative_tokens": 5, "parallel_drafting": True}
    table = serving_table("$BUNDLE/draft", 5)
    assert table["tensorrt_llm"]["served"] is False and "PARD" in table["tensorrt_llm"]["why"]
    assert table["sglang"]["served"] is False
    with pytest.raises(UserError):
        vllm_speculative_config("d", 0)
