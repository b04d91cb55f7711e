"""One rule for "this request is greedy", TensorRT-LLM's (sampling_params.py @a98a9061): temperature 0,
top_k 1 or top_p 0. The runtime serves such requests greedily and ``alpha --traffic`` measures captured
ones as greedy, through the same function (runtime/llm_api.implies_greedy)."""

from __future__ import annotations

import pytest

from eagle3_trt.formats.traffic import CapturedSampling, ServedAcceptance, TrafficRecord
from eagle3_trt.runtime.factory import open_llm
from eagle3_trt.runtime.llm_api import SamplingParams, implies_greedy
from eagle3_trt.runtime.traffic_measure import is_greedy


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "greedy"),
    [(0.0, None, None, True), (0.8, 1, None, True), (0.8, None, 0.0, True), (0.8, 5, 0.9, False), (None, None, None, False)],
)
def test_rule_and_captured_traffic_agree(temperature, top_k, top_p, greedy):
    assert implies_greedy(temperature, top_k, top_p) is greedy
    assert SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p).greedy is greedy
    if temperature is not None:
        s = CapturedSampling(temperature=temperature, top_k=top_k or 0, top_p=1.0 if top_p is None else top_p, max_tokens=8)
        acc = ServedAcceptance(speculative=True, draft_tokens=3, accepted_draft_tokens=1, target_forwards=2, completion_tokens=3)
        rec = TrafficRecord(
            request_id="r", time_unix=0.0, bundle_fingerprint="f", model="eagle3", frontend="dynamo", chat=False, prompt_text=None,
            prompt_ids=[1], output_ids=[2], sampling=s, acceptance=acc,
        )  # fmt: skip
        assert is_greedy(rec) is greedy


def test_top_p_zero_is_served_greedily(fp8_bundle):
    """TensorRT-LLM decodes top_p=0 greedily; the reference runtime did not (it handed top_p 0 to the sampler)."""
    llm = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1)
    try:
        prompt = [1, 2, 3, 4, 5]
        greedy = llm.generate_async(prompt, SamplingParams(max_tokens=8, temperature=0.0)).result(timeout=120).outputs[0].token_ids
        top_p0 = llm.generate_async(prompt, SamplingParams(max_tokens=8, temperature=0.9, top_p=0.0, seed=1)).result(timeout=120).outputs[0].token_ids
        assert list(top_p0) == list(greedy) and len(greedy) == 8
    finally:
        llm.shutdown()
