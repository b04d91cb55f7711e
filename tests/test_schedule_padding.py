"""TensorRT-LLM's one-model path drafts inside iteration i's forward with iteration i's K, and
``PyExecutor._handle_dynamic_draft_len`` (py_executor.py, main @ 0004396720054fd8e205cbf616f21f0b57c6b412)
fits those drafts to iteration i+1's K: padded with token 0 when K rose, truncated when it fell
(core/engine.py ``_pad_to_k``). Hand-worked on the tiny pair with ``draft_len_schedule`` {1: 1, 2: 3}:
request A runs alone (batch 1, K=1), request B arrives (batch 2, K=3); A's first iteration at K=3
verifies [real, 0, 0]."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_trt.core.speculation_control import draft_len_for_batch

HELD = json.loads((Path(__file__).resolve().parents[1] / "models" / "tiny" / "heldout_prompts.json").read_text())["prompts"]
SCHEDULE = {1: 1, 2: 3}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset
    from eagle3_trt.runtime.loader import engine_from_bundle
    from eagle3_trt.testing.behaviour_cases import copy_embedded

    tmp = tmp_path_factory.mktemp("schedule-padding")
    t, d = copy_embedded("tiny", tmp / "pair")
    req = EngineRequest(preset=load_preset("tiny"), target=str(t), draft=str(d), target_gpu="h100", quant="bf16", out=str(tmp / "bundle"))
    eng = engine_from_bundle(build_bundle(req).bundle, device="cpu")
    assert eng.max_draft_len == 3
    return eng


def _drive(eng, prompt: list[int], max_tokens: int, ks: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """Step one greedy request as runtime/reference_llm.py does: before iteration i (0 = the
    prefill) the scheduler sets the engine's K to ``ks[i]`` (the last entry from then on). Returns the
    text and each verification's (drafted, accepted) as the request's stats report them."""
    from eagle3_trt.core.engine import SamplingParams

    gen = eng.stream(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    toks: list[int] = []
    steps: list[tuple[int, int]] = []
    d0 = a0 = 0
    i = 0
    try:
        while True:
            eng.k_cap = ks[min(i, len(ks) - 1)]
            s = next(gen)
            toks += s.new_token_ids
            d, a = s.stats.draft_tokens, s.stats.accepted_tokens
            if i > 0:
                steps.append((d - d0, a - a0))
            d0, a0, i = d, a, i + 1
    except StopIteration:
        pass
    finally:
        eng.k_cap = None
    return toks, steps


def test_k_rising_verifies_the_previous_k_real_drafts_then_token_0(engine):
    prompt, max_tokens = HELD[0][:24], 40
    k_alone, k_pair = draft_len_for_batch(SCHEDULE, 1, 3), draft_len_for_batch(SCHEDULE, 2, 3)
    assert (k_alone, k_pair) == (1, 3)

    # A alone all along (K=1 every iteration): its text (the target's greedy tokens) and, per
    # verification, whether the one real draft was accepted
    text, alone = _drive(engine, prompt, max_tokens, [k_alone])
    assert all(d == 1 for d, _ in alone[:-1])
    # B arrives before A's 4th verification (iteration 4): A has verified three times at K=1 and
    # accepts its real draft there. (With real drafts at K=3 that verification accepts 3 on this
    # prompt: the behaviour this replaces.)
    j = 4
    assert alone[j - 1][1] == 1
    emitted = 1 + sum(a + 1 for _, a in alone[: j - 1])  # tokens A has before verification j (prefill's included)

    # by hand, from the rule: verification j verifies [d, 0, 0] where d is the K=1 run's draft
    # (same history up to here), accepted = text[emitted]; a pad is accepted only where the
    # target's greedy token is 0 and everything before it was accepted
    accepted_j = 1 + (text[emitted + 1] == 0) * (1 + (text[emitted + 2] == 0))
    ks = [k_alone] * j + [k_pair]  # iterations 0..j-1 at batch 1, from iteration j (verification j) on at batch 2
    served_text, served = _drive(engine, prompt, max_tokens, ks)

    print(f"verification {j}: K 1 -> 3, drafts [{text[emitted]}, 0, 0], reported (drafted, accepted) {served[j - 1]}")
    assert served[: j - 1] == alone[: j - 1]  # before B arrives: the K=1 run's counts
    assert served[j - 1] == (3, accepted_j)  # drafted counts the pads (len(py_draft_tokens)); token 0 is rarely the target's
    assert accepted_j == 1 and text[emitted + 1] != 0
    assert served[j][0] == 3  # the next verification's drafts were made at K=3: all real
    assert served_text == text  # greedy: the schedule changes the speed, never the text


def test_k_falling_truncates_and_without_a_schedule_nothing_changes(engine):
    """K 3 -> 1 keeps the first of the three drafts made at K=3: the same verification as drafting
    one (the chain's first draft does not depend on the rest); K constant: every draft real."""
    prompt, max_tokens = HELD[1][:24], 16
    text3, all3 = _drive(engine, prompt, max_tokens, [3])
    text_none, none_ = _drive(engine, prompt, max_tokens, [None])  # type: ignore[list-item]
    assert (text3, all3) == (text_none, none_)
    text_fall, fall = _drive(engine, prompt, max_tokens, [3, 3, 1])
    assert fall[:1] == all3[:1] and fall[1][0] == 1 and text_fall == text3
