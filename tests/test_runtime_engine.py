"""Greedy speculative decoding in the reference runtime is token-for-token Hugging Face greedy decoding.

References are produced by transformers' own ``generate(do_sample=False)`` on the same target
checkpoint, one prompt at a time, independently of the runtime's code. The runtime runs chain
and tree drafting, batch 1 and batch > 1 (prompts of different lengths, so rows accept different
numbers of tokens and the per-row KV rollback is exercised), with a random draft (almost every
draft token rejected) and with a draft distilled onto the target (most accepted), on the
embedded tiny pair and on a second random Llama of another shape.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from eagle3_trt.convert.load import load_engine
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.core.tree import DraftTree
from eagle3_trt.speculative.dynamic_tree.builder import DynamicTreeConfig
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.testing.tiny_pair import TinyShape, make_pair
from eagle3_trt.train.trainer import distill_draft

MAX_NEW = 24
TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]


def _prompts(seed: int, n: int, vocab: int = 512) -> list[list[int]]:
    rng = random.Random(seed)
    return [[0] + [rng.randrange(6, vocab) for _ in range(rng.randrange(3, 14))] for _ in range(n)]


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    t, d = make_pair(tmp_path_factory.mktemp("pair"))
    hf = AutoModelForCausalLM.from_pretrained(str(t), dtype=torch.float32).eval()
    random_draft = load_engine(t, d, dtype=torch.float32, max_draft_len=3)
    trained = load_engine(t, d, dtype=torch.float32, max_draft_len=3)
    train_prompts = _prompts(1, 24)
    distill_draft(trained, train_prompts, steps=120, lr=5e-3, gen_tokens=32)
    # half seen in distillation (long accepted runs), half unseen (mostly rejections)
    prompts = train_prompts[:3] + _prompts(2, 3)
    refs = [_hf_greedy(hf, p, MAX_NEW) for p in prompts]
    return {"hf": hf, "random": random_draft, "trained": trained, "prompts": prompts, "refs": refs}


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A random Llama of another shape (GQA 6/3 heads, 10 layers, hidden 96) with a random draft."""
    from transformers import AutoModelForCausalLM

    shape = TinyShape(hidden_size=96, num_hidden_layers=10, num_attention_heads=6, num_key_value_heads=3, intermediate_size=160, draft_intermediate_size=128)
    t, d = make_pair(tmp_path_factory.mktemp("other"), shape=shape, seed=7)
    hf = AutoModelForCausalLM.from_pretrained(str(t), dtype=torch.float32).eval()
    eng = load_engine(t, d, dtype=torch.float32, max_draft_len=4)
    prompts = _prompts(3, 4)
    return {"eng": eng, "prompts": prompts, "refs": [_hf_greedy(hf, p, MAX_NEW) for p in prompts]}


@pytest.mark.parametrize("draft", ["random", "trained"])
@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_batch1_matches_hf(tiny, draft, tree):
    eng = tiny[draft]
    for p, ref in zip(tiny["prompts"], tiny["refs"]):
        (res,) = eng.generate([p], SamplingParams(max_tokens=MAX_NEW), tree=tree)
        assert res.token_ids == ref
        # the prefill emits one token; every later target forward the drafts it accepted plus its own
        st = res.stats
        assert st.generated_tokens == st.target_forwards + st.accepted_tokens == len(ref), st
    if draft == "trained":  # the accept path really ran
        got = eng.generate(tiny["prompts"][:1], SamplingParams(max_tokens=MAX_NEW), tree=tree)[0]
        assert got.stats.accepted_tokens > got.stats.draft_tokens // 2


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_batched_matches_hf(tiny, tree):
    eng = tiny["trained"]
    res = eng.generate(tiny["prompts"], SamplingParams(max_tokens=MAX_NEW), tree=tree)
    assert [r.token_ids for r in res] == tiny["refs"]
    acc = [r.stats.accepted_tokens for r in res]
    assert max(acc) > 2 * min(acc) + 4, acc  # rows accepted very different amounts: per-row rollback was needed


def test_k0_is_plain_greedy_with_one_forward_per_token(tiny):
    eng = tiny["trained"]
    res = eng.generate(tiny["prompts"], SamplingParams(max_tokens=MAX_NEW), speculate=False)
    assert [r.token_ids for r in res] == tiny["refs"]
    for r in res:
        assert r.stats.target_forwards == r.stats.generated_tokens == MAX_NEW
        assert r.stats.draft_tokens == 0 and not r.stats.speculation
        assert r.stats.acceptance_length == 1.0


@pytest.mark.parametrize("tree", [None, [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]], ids=["chain", "tree"])
def test_random_model_other_shape(other, tree):
    eng = other["eng"]
    res = eng.generate(other["prompts"], SamplingParams(max_tokens=MAX_NEW), tree=tree)
    assert [r.token_ids for r in res] == other["refs"]
    for p, ref in zip(other["prompts"][:2], other["refs"]):
        assert eng.generate([p], SamplingParams(max_tokens=MAX_NEW), tree=tree)[0].token_ids == ref


def test_stop_tokens_and_max_tokens(tiny):
    eng = tiny["trained"]
    p, ref = tiny["prompts"][0], tiny["refs"][0]
    # stop at the first occurrence of a token that appears mid-sequence (often inside an accepted run)
    stop_tok = ref[5]
    cut = ref.index(stop_tok) + 1
    for tree in (None, TREE):
        (r,) = eng.generate([p], SamplingParams(max_tokens=MAX_NEW, stop_token_ids=(stop_tok,)), tree=tree)
        assert r.token_ids == ref[:cut] and r.finish_reason == "stop"
    for n in (1, 2, 7):
        (r,) = eng.generate([p], SamplingParams(max_tokens=n))
        assert r.token_ids == ref[:n] and r.finish_reason == "length"
        assert r.stats.draft_tokens <= max(0, n - 1) * eng.max_draft_len
    (r,) = eng.generate([p], SamplingParams(max_tokens=0))
    assert r.token_ids == [] and r.finish_reason == "length"


def test_eos_from_config_stops_generation(tiny):
    eng = tiny["trained"]
    assert set(eng.eos_token_ids) >= {1, 4}  # <|end_of_text|>, <|eot_id|> of the tiny tokenizer
    p, ref = tiny["prompts"][1], tiny["refs"][1]
    eng.eos_token_ids = eng.eos_token_ids + (ref[3],)
    try:
        (r,) = eng.generate([p], SamplingParams(max_tokens=MAX_NEW))
    finally:
        eng.eos_token_ids = eng.eos_token_ids[:-1]
    assert r.token_ids == ref[: ref.index(ref[3]) + 1] and r.finish_reason == "stop"


def test_stream_yields_the_generated_tokens(tiny):
    eng = tiny["trained"]
    p, ref = tiny["prompts"][0], tiny["refs"][0]
    steps = list(eng.stream(p, SamplingParams(max_tokens=MAX_NEW)))
    assert [t for s in steps for t in s.new_token_ids] == ref
    assert steps[-1].finished and steps[-1].finish_reason == "length"
    assert not any(s.finished for s in steps[:-1])
    assert len(steps) == steps[-1].stats.target_forwards  # one StepOutput per target forward
    assert max(len(s.new_token_ids) for s in steps) > 1
    st = steps[-1].stats
    assert st.arrival_time_ns <= st.first_token_time_ns <= st.last_token_time_ns
    # each StepOutput carries the statistics as of that step (a snapshot, not the live object)
    assert [s.stats.generated_tokens for s in steps] == list(itertools.accumulate(len(s.new_token_ids) for s in steps))


def test_tree_helpers():
    t = DraftTree.from_choices([[1], [0], [0, 0], [0, 1], [1, 0]])
    assert t.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert t.parent == (-1, -1, 0, 0, 1) and t.max_depth == 2 and not t.is_chain
    assert DraftTree.chain(3).is_chain and DraftTree.chain(3).size == 3
    anc = t.ancestors()
    assert anc[3].tolist() == [True, False, False, True, False]
    from eagle3_trt.errors import UserError

    with pytest.raises(UserError, match="no parent"):
        DraftTree.from_choices([[0], [1, 0]])


def test_user_errors(tiny):
    from eagle3_trt.errors import UserError

    eng = tiny["random"]
    with pytest.raises(UserError, match="greedy"):
        eng.generate([[0, 7]], SamplingParams(max_tokens=4, temperature=1.0), tree=TREE)
    with pytest.raises(UserError, match="max_seq_len"):
        eng.generate([[7] * eng.max_seq_len], SamplingParams(max_tokens=4))
    with pytest.raises(UserError, match="outside the vocabulary"):
        eng.generate([[0, 10**6]], SamplingParams(max_tokens=4))
    with pytest.raises(UserError, match="top_p"):
        SamplingParams(top_p=0.0)
    saved = eng.target.aux_layer_ids
    eng.target.aux_layer_ids = (1, 3)  # the draft's fc fuses three layers
    try:
        with pytest.raises(UserError, match="aux layers"):
            SpeculativeEngine(eng.target, eng.draft, None, max_draft_len=3)
    finally:
        eng.target.aux_layer_ids = saved


# TensorRT-LLM's dynamic tree (speculative/dynamic_tree/builder.py): every row builds its own tree each step, so a
# batch verifies different trees side by side (per-row ancestor masks) and rolls back per row.
DYNAMIC = [DynamicTreeConfig(2), DynamicTreeConfig(4, 6)]


@pytest.mark.parametrize("draft", ["random", "trained"])
@pytest.mark.parametrize("cfg", DYNAMIC, ids=["top2", "top4-total6"])
def test_greedy_dynamic_tree_matches_hf(tiny, draft, cfg):
    eng = tiny[draft]
    eng.method = DynamicTreeMethod(cfg)
    try:
        batched = eng.generate(tiny["prompts"], SamplingParams(max_tokens=MAX_NEW))
        one = [eng.generate([p], SamplingParams(max_tokens=MAX_NEW))[0] for p in tiny["prompts"][:2]]
    finally:
        eng.method = None
    assert [r.token_ids for r in batched] == tiny["refs"]
    assert [r.token_ids for r in one] == tiny["refs"][:2]
    for r in batched:
        st = r.stats
        assert st.generated_tokens == st.target_forwards + st.accepted_tokens == MAX_NEW, st
    if draft == "trained":  # the accept path really ran, and rows accepted different amounts
        acc = [r.stats.accepted_tokens for r in batched]
        assert max(acc) > 2 * min(acc) + 4, acc


def test_dynamic_tree_other_shape(other):
    eng = other["eng"]
    eng.method = DynamicTreeMethod(DynamicTreeConfig(3, 8))
    try:
        res = eng.generate(other["prompts"], SamplingParams(max_tokens=MAX_NEW))
    finally:
        eng.method = None
    assert [r.token_ids for r in res] == other["refs"]
