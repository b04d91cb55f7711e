"""The estimator replays the suffix-automaton enhancer exactly: same counts as the engine's loop.

``runtime/estimator.walk_chain`` applies TensorRT-LLM's SA override (sa_enhancer.py: all K tokens
replaced when the match is >= threshold) over the target's greedy continuation; the engine applies
it inside speculative generation (``SpeculativeEngine._sa_override``). On the embedded tiny pair,
whose greedy output repeats itself, both must give identical per-request statistics, and the
enhancer must actually change them (else the comparison would be vacuous).
"""

from __future__ import annotations

import pytest
import torch

from eagle3_trt.convert.load import load_engine
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.core.suffix_automaton import SAConfig
from eagle3_trt.errors import UserError
from eagle3_trt.resources import data_dir
from eagle3_trt.runtime.estimator import estimate

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
    eng.sa = None
    chain = estimate(eng, prompts, 40)
    eng.sa = SAConfig(threshold=threshold)
    try:
        est = estimate(eng, prompts, 40, sweep=(2,))
        gen = eng.generate(prompts, params)
        eng.max_draft_len = 2
        gen_k2 = eng.generate(prompts, params)
    finally:
        eng.sa, eng.max_draft_len = None, 3
    assert [r.token_ids for r in gen] == est.continuations == chain.continuations  # greedy output is the target's either way
    for e, g in zip(est.stats, gen):
        assert _fields(e) == _fields(g.stats)
    for e, g in zip(est.by_k[2], gen_k2):  # a swept K replays the SA's first K tokens too
        assert _fields(e) == _fields(g.stats)
    assert [_fields(s) for s in est.stats] != [_fields(s) for s in chain.stats]  # the automaton overrode drafts


def test_estimator_refuses_global_pool(engine):
    eng, prompts = engine
    eng.sa = SAConfig(threshold=4, enable_global_pool=True)
    try:
        with pytest.raises(UserError) as e:
            estimate(eng, prompts[:1], 8)
    finally:
        eng.sa = None
    assert e.value.where == "sa_config.enable_global_pool"
