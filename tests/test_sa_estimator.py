"""The estimator replays the suffix-automaton enhancer exactly: same counts as the engine's loop.

``measure/estimator.walk_chain_batch`` replays TensorRT-LLM's SA enhancer (speculative/sa/automaton.py
``SAEnhancer``: no override on the first decode, the prefill's token outside the automaton, stale
buffer slots by decoding position, the global pool over the batch) over the target's greedy
continuations, batch by batch as ``measure`` generates them; the engine applies it inside
speculative generation. On the embedded tiny pair, whose greedy output repeats itself, both must
give identical per-request statistics, and the enhancer must actually change them (else the
comparison would be vacuous).
"""

from __future__ import annotations

import pytest
import torch

from eagle3_trt.convert.load import load_engine
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.measure.estimator import estimate
from eagle3_trt.resources import data_dir
from eagle3_trt.speculative.sa.automaton import SAConfig
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod

FIELDS = ("draft_tokens", "accepted_tokens", "target_forwards", "generated_tokens", "accepted_per_position", "accept_hist")
TEXTS = (
    "x = 1\ny = 2\n" * 4,
    "    print(i)\n" * 4,
    "def add(a, b):\n    return a + b\n\n" * 2,
    "import os\n" * 4,
)


@pytest.fixture(scope="module")
def engine():
    pair = data_dir("models") / "tiny"
    eng = load_engine(pair / "target", pair / "draft", dtype=torch.float32, max_draft_len=3)
    prompts = [list(eng.tokenizer(t, add_special_tokens=True)["input_ids"]) for t in TEXTS]
    return eng, prompts


def _fields(s) -> tuple:
    return tuple(getattr(s, f) for f in FIELDS)


@pytest.mark.parametrize("threshold", [2, 4])
def test_estimator_replays_sa_exactly(engine, threshold):
    eng, prompts = engine
    params = SamplingParams(max_tokens=40)
    eng.method = None
    chain = estimate(eng, prompts, 40)
    eng.method = SuffixAutomatonMethod(SAConfig(threshold=threshold))
    try:
        est = estimate(eng, prompts, 40, sweep=(2,))
        gen = eng.generate(prompts, params)
        eng.max_draft_len = 2
        gen_k2 = eng.generate(prompts, params)
    finally:
        eng.method, eng.max_draft_len = None, 3
    assert [r.token_ids for r in gen] == est.continuations == chain.continuations  # greedy output is the target's either way
    for e, g in zip(est.stats, gen):
        assert _fields(e) == _fields(g.stats)
    for e, g in zip(est.by_k[2], gen_k2):  # a swept K replays the SA's first K tokens too
        assert _fields(e) == _fields(g.stats)
    assert [_fields(s) for s in est.stats] != [_fields(s) for s in chain.stats]  # the automaton overrode drafts


@pytest.mark.parametrize("pool", [False, True], ids=["own", "global-pool"])
def test_estimator_replays_batches_and_the_global_pool(engine, pool):
    # batches of 3 over 4 prompts (as measure generates them): rows finish at different steps, so
    # decoding positions shift in the draft buffer; with the global pool rows search each other
    eng, prompts = engine
    prompts = prompts + prompts[:2]
    eng.method = SuffixAutomatonMethod(SAConfig(threshold=2, enable_global_pool=pool))
    try:
        est = estimate(eng, prompts, 40, batch_size=3)
        gen = eng.generate(prompts[:3], SamplingParams(max_tokens=40)) + eng.generate(prompts[3:], SamplingParams(max_tokens=40))
    finally:
        eng.method = None
    for e, g in zip(est.stats, gen):
        assert _fields(e) == _fields(g.stats)
