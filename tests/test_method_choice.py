"""The method hooks drive the cost model and the method choice (measure/method_choice.py): each
registered method's step cost comes from its home's ``cost.step_seconds`` (speculative/registry.py
``step_cost``), P-EAGLE's prediction differs from the chain's exactly by what its hook says (one
draft forward for K tokens instead of K sequential ones), and the choice per concurrency picks the
method, the K, or speculation off from the measured acceptance."""

from __future__ import annotations

import pytest

from eagle3_trt.measure.bundle_costs import method_of
from eagle3_trt.measure.cost_model import CostParams, expected_tokens, forward_time_s, model_costs, predict, recommend
from eagle3_trt.measure.method_choice import Candidate, choose
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.speculative.eagle3 import cost as chain_cost
from eagle3_trt.speculative.peagle import cost as peagle_cost
from eagle3_trt.speculative.registry import METHODS, step_cost

P = CostParams()
GPU = get_gpu("h100")
# an 8B BF16 target with a one-layer head (whole-model figures, as bundle_costs reads them from a bundle)
COSTS = dict(
    gpu=GPU,
    tp=1,
    target_bytes=16e9,
    draft_bytes=0.9e9,
    target_format="bf16",
    draft_format="bf16",
    target_kv_bytes_per_token=131072,
    draft_kv_bytes_per_token=4096,
    target_layers=32,
    hidden=4096,
    target_params=None,
    target_moe=None,
)
CUM = [0.8, 0.6, 0.45, 0.33]


def _curves(cum: list[float]) -> dict[int, list[float]]:
    return {k: cum for k in range(1, len(cum) + 1)}


def test_every_registered_method_has_a_step_cost_in_its_home():
    for name in METHODS:
        hook = step_cost(name)
        assert callable(hook), name
    assert step_cost("chain") is chain_cost.step_seconds
    assert step_cost("peagle") is peagle_cost.step_seconds
    assert step_cost("sa") is not None and step_cost("dynamic-tree") is not None


def test_peagle_differs_from_the_chain_by_its_hook():
    """Same acceptance, same models: the two predictions' iteration times differ by the chain's K
    sequential draft forwards (one over E tokens, K-1 over one token per sequence) against P-EAGLE's
    one forward over E + K - 1 tokens per sequence; the verification is the same."""
    _, _, tcost, dcost = model_costs(COSTS)
    for batch in (1, 8, 64):
        k, e = 4, expected_tokens(CUM, 4)
        ch = predict(CUM, GPU, tcost, dcost, 1, batch, k, P, method="chain")
        pe = predict(CUM, GPU, tcost, dcost, 1, batch, k, P, method="peagle")

        def d(tokens: float, batch: int = batch) -> float:
            return forward_time_s(dcost, GPU, tokens, batch * P.context_len, 1, P, P.draft_step_overhead_us)[0]

        chain_draft = d(batch * e) + (k - 1) * d(batch)
        peagle_draft = d(batch * (e + k - 1))
        assert (ch.t_spec_us - pe.t_spec_us) * 1e-6 == pytest.approx(chain_draft - peagle_draft, rel=1e-9)
        assert ch.t_base_us == pe.t_base_us and ch.tokens_per_iteration == pe.tokens_per_iteration
    # memory-bound at batch 1 P-EAGLE saves K-1 draft forwards: with equal acceptance it predicts more
    assert predict(CUM, GPU, tcost, dcost, 1, 1, 4, P, method="peagle").speedup > predict(CUM, GPU, tcost, dcost, 1, 1, 4, P, method="chain").speedup


def test_recommend_prices_k_through_the_method():
    """recommend's table for P-EAGLE is its hook's, not the chain's: at batch 1 every K predicts faster."""
    ch = recommend(CUM, **COSTS, batches=(1,), method="chain")
    pe = recommend(CUM, **COSTS, batches=(1,), method="peagle")
    by = {(r["k"]): r["speedup"] for r in ch.table}
    for r in pe.table:
        if r["k"] == 1:  # one draft token: one draft forward either way
            assert r["speedup"] == pytest.approx(by[1])
        else:
            assert r["speedup"] > by[r["k"]]
    assert pe.evidence["method"] == "peagle" and ch.evidence["method"] == "chain"


def test_choice_per_concurrency_method_k_and_off():
    """Equal acceptance: P-EAGLE wins at batch 1. A P-EAGLE head whose mask slots are rarely accepted:
    the chain wins. A head nothing is accepted from: speculation off everywhere."""
    chain = Candidate("eagle3", "chain", _curves(CUM), COSTS)
    equal = Candidate("peagle", "peagle", _curves(CUM), COSTS)
    rows = {c.concurrency: c for c in choose([chain, equal], [1, 4])}
    assert rows[1].label == "peagle" and rows[1].method == "peagle" and rows[1].speedup > 1
    assert rows[1].by_bundle["peagle"][1] > rows[1].by_bundle["eagle3"][1]

    weak = Candidate("peagle", "peagle", _curves([0.8, 0.2, 0.05, 0.01]), COSTS)
    rows = {c.concurrency: c for c in choose([chain, weak], [1])}
    assert rows[1].label == "eagle3" and rows[1].k == rows[1].by_bundle["eagle3"][0]

    nothing = [0.0, 0.0, 0.0, 0.0]
    rows = {c.concurrency: c for c in choose([Candidate("a", "chain", _curves(nothing), COSTS), Candidate("b", "peagle", _curves(nothing), COSTS)], [1, 64])}
    assert all(c.label is None and c.k is None and c.speedup == 1.0 for c in rows.values())
    assert rows[1].to_dict()["deploy"] is None


def test_choice_picks_k_per_bundle():
    """A short-K chain head accepted well only at position 1: its best K is 1 or 2, not 4."""
    steep = [0.9, 0.1, 0.01, 0.001]
    (row,) = choose([Candidate("x", "chain", _curves(steep), COSTS)], [1])
    assert row.k in (1, 2) and row.label == "x"


def test_method_of_a_bundle(fp8_bundle):
    assert method_of(open_bundle(fp8_bundle)) == "chain"
