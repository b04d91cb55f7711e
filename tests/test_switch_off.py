"""TensorRT-LLM's draft length per batch size and acceptance-rate switch-off (core/speculation_control.py),
hand-worked from the upstream rule, then through the real ReferenceLLM on the tiny bundle."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from eagle3_trt.core.speculation_control import SpeculationControl, SpeculationGate, draft_len_for_batch, iteration_rate, schedule_from_options


def test_schedule_is_tensorrt_llms_upper_bound_rule():
    # utils.get_draft_len_for_batch_size's own example: {4: 4, 8: 2, 32: 1}
    s = {4: 4, 8: 2, 32: 1}
    assert [draft_len_for_batch(s, b, 4) for b in (1, 4, 5, 8, 9, 32, 33, 500)] == [4, 4, 2, 2, 1, 1, 0, 0]
    assert draft_len_for_batch(None, 77, 3) == 3
    assert schedule_from_options(None, 6, 3) == {6: 3}  # llm_args.py: max_concurrency -> {max_concurrency: K}
    assert schedule_from_options(None, None, 3) is None


def test_iteration_sample_pools_the_rows_that_drafted():
    # one sample per iteration: sum(accepted) / sum(drafted) over rows with drafts; a prefill row (0 drafted) is left out
    assert iteration_rate([3, 3, 0], [3, 0, 0]) == 0.5
    assert iteration_rate([0, 0], [0, 0]) is None


def test_gate_hand_worked_trace_window_counts_iterations_and_trips_for_good():
    g = SpeculationGate(window=3, threshold=0.5)
    # samples 1.0, 0.0, 0.6: mean 0.533 >= 0.5 once 3 are recorded; then 0.0 -> window (0.0, 0.6, 0.0) mean 0.2 < 0.5
    assert [g.record(r) for r in (1.0, 0.0, 0.6)] == [False, False, False]
    assert g.record(0.0) is True and g.disabled
    assert g.record(1.0) is False  # disabled for good: nothing recorded any more
    with pytest.raises(ValueError):
        SpeculationGate(window=0, threshold=0.5)


@pytest.mark.parametrize(("overlap", "off_from"), [(True, 6), (False, 5)])
def test_switch_off_takes_effect_one_iteration_later_under_the_overlap_scheduler(overlap, off_from):
    c = SpeculationControl(max_draft_len=3, gate=SpeculationGate(2, 0.5), overlap_scheduler=overlap)
    # iteration 0: prefill (no drafts, no sample); 1..: one row drafting 3
    accepted = [None, 3, 1, 2, 0, 0, 0, 0]
    ks = []
    for a in accepted:
        k = c.k_for(1)
        ks.append(k)
        c.after([0] if a is None or k == 0 else [k], [0] if a is None or k == 0 else [min(a, k)])
    # samples 1.0, 1/3 (mean 0.667), 2/3 (0.5: not below), 0.0 (mean 0.333 < 0.5: trips on iteration 4)
    assert c.tripped_on == 4 and c.off_from == off_from
    assert ks == [3] * off_from + [0] * (len(accepted) - off_from)


# ---- through the real ReferenceLLM (the scheduler Triton and Dynamo drive) on the embedded tiny pair


HELD = json.loads((Path(__file__).resolve().parents[1] / "models" / "tiny" / "heldout_prompts.json").read_text())["prompts"]


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory) -> Path:
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset
    from eagle3_trt.testing.behaviour_cases import copy_embedded

    tmp = tmp_path_factory.mktemp("switch-off")
    t, d = copy_embedded("tiny", tmp / "pair")
    req = EngineRequest(preset=load_preset("tiny"), target=str(t), draft=str(d), target_gpu="h100", quant="bf16", out=str(tmp / "bundle"))
    return build_bundle(req).bundle


def _with_spec(bundle: Path, tmp: Path, **spec) -> Path:
    from eagle3_trt.pipeline import bundle_write
    from eagle3_trt.pipeline.bundle import open_bundle

    b = tmp / "b"
    shutil.copytree(bundle, b)
    o = open_bundle(b).options
    bundle_write.update(b, options=o.model_copy(update={"speculative_config": o.speculative_config.model_copy(update=spec)}))
    return b


def _serve(bundle: Path, prompts: list[list[int]], max_tokens: list[int]):
    from eagle3_trt.runtime.llm_api import SamplingParams
    from eagle3_trt.runtime.reference_llm import ReferenceLLM

    llm = ReferenceLLM(bundle, device="cpu")
    try:

        async def run():
            outs = [llm.generate_async(p, SamplingParams(max_tokens=m, temperature=0.0)) for p, m in zip(prompts, max_tokens, strict=True)]
            for o in outs:
                async for _ in o:
                    pass
            return outs

        return asyncio.run(run()), llm.control
    finally:
        llm.shutdown()


def test_switch_off_hand_worked_on_one_request(tiny_bundle, tmp_path):
    """One greedy request: round 0 is its prefill, round j its j-th verification. The unconstrained
    run gives each verification's (drafted, accepted); TensorRT-LLM's rule, applied here by hand
    (one sample per iteration, mean of the last W once W are recorded, below T: off for good, the
    overlap scheduler's next iteration still drafting), says which round trips and which drafts
    nothing; the served request must do exactly that and still emit the target's own tokens."""
    from eagle3_trt.core.engine import SamplingParams as EngineParams
    from eagle3_trt.runtime.loader import engine_from_bundle

    prompt, max_tokens, W = HELD[0][:24], 40, 4
    eng = engine_from_bundle(tiny_bundle, device="cpu")
    steps, prev, toks = [], None, []
    for s in eng.stream(prompt, EngineParams(max_tokens=max_tokens, temperature=0.0)):
        toks += s.new_token_ids
        st = s.stats
        d, a = st.draft_tokens - (prev.draft_tokens if prev else 0), st.accepted_tokens - (prev.accepted_tokens if prev else 0)
        steps.append((d, a))
        prev = st
    plain = list(s.stats.accepted_seq)
    rates = [a / d for d, a in steps[1:] if d > 0]
    assert len(rates) >= 6 and len(set(rates)) > 1, "the tiny pair must accept some drafts and reject others"
    means = [sum(rates[j - W + 1 : j + 1]) / W for j in range(W - 1, len(rates))]
    # the threshold: just above the lowest window mean among the early ones, so the trip lands mid-request
    early = means[: max(1, len(means) // 2)]
    T = min(early) + 1e-6
    trip_sample = next(j for j in range(W - 1, len(rates)) if means[j - W + 1] < T)
    tripped_round = trip_sample + 1  # sample j comes from round j + 1 (round 0 is the prefill)
    off_from = tripped_round + 2  # overlap scheduler (the bundle's default): one more round drafts

    print(f"samples {[round(r, 3) for r in rates]}, T {T:.4f}: trips on round {tripped_round}, drafts nothing from round {off_from}")
    b = _with_spec(tiny_bundle, tmp_path, acceptance_rate_window_size=W, acceptance_rate_threshold=T)
    (out,), ctl = _serve(b, [prompt], [max_tokens])
    assert ctl.tripped_on == tripped_round and ctl.off_from == off_from
    ks = [k for _, k, _ in ctl.rounds]
    assert all(k == 3 for k in ks[:off_from]) and all(k == 0 for k in ks[off_from:])
    served = out.outputs[0].request_perf_metrics.speculative_decoding
    # drafts stop after round off_from - 1: the first off_from - 1 verifications are the unconstrained run's
    assert served.total_draft_tokens == sum(d for d, _ in steps[1:off_from])
    assert served.total_accepted_draft_tokens == sum(plain[: off_from - 1])
    assert out.outputs[0].token_ids == toks  # greedy: the switch-off changes the speed, never the text


def test_schedule_follows_the_batch_size_each_round(tiny_bundle, tmp_path):
    """Four concurrent requests of different lengths: the batch shrinks 4 -> 1 as they finish (the
    overlap scheduler still counting a request the round after it finished); every round drafts
    the K ``{1: 3, 2: 2, 3: 1}`` gives its batch size (0 above 3), and no row drafts more."""
    b = _with_spec(tiny_bundle, tmp_path, draft_len_schedule={1: 3, 2: 2, 3: 1})
    outs, ctl = _serve(b, [p[:20] for p in HELD[:4]], [6, 12, 18, 30])
    rounds = list(ctl.rounds)
    assert {k for _, k, _ in rounds} == {0, 1, 2, 3}
    for batch, k, drafted in rounds:
        assert k == draft_len_for_batch({1: 3, 2: 2, 3: 1}, batch, 3)
        assert all(d <= k for d in drafted)
    assert any(k == 0 and len(drafted) == 3 for _, k, drafted in rounds), "a round with 3 live requests and 1 just finished drafts nothing"
    assert all(len(o.outputs[0].token_ids) == m for o, m in zip(outs, [6, 12, 18, 30], strict=True))
