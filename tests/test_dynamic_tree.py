"""TensorRT-LLM's EAGLE-3 dynamic tree (speculative/dynamic_tree/builder.py) against hand-worked examples of its
algorithm (the tree, the greedy walk, the first decode with no stored tree, the sampled walk), its
refusals, and the engine running it (topK 1 is NOT the chain: its first decode accepts nothing;
per-row trees in a batch; temperature > 0). Greedy identity with Hugging Face generate is in
tests/test_runtime_engine.py; an independent re-derivation is in tests/test_engine_cross_check.py.

Algorithm source: NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/eagle3_dynamic_tree.py
@057c8a65 (``_select_topk_draft_tokens``: score = child probability x parent score, top-K of the
K*K candidates expanded; ``_resample_final_tokens``: top-N of the whole history, sorted by history
index) and cpp/tensorrt_llm/kernels/speculativeDecoding/dynamicTreeKernels.cu @84e55f93
(``buildDynamicTreeKernel`` parents and positions, ``verifyDynamicTreeGreedyKernel`` the walk);
ranges from tensorrt_llm/llmapi/llm_args.py @00043967.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from eagle3_trt.convert.load import load_engine
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.core.requests import Row
from eagle3_trt.core.stats import RequestStats
from eagle3_trt.core.verify import accept
from eagle3_trt.errors import UserError
from eagle3_trt.resources import data_dir
from eagle3_trt.speculative.dynamic_tree.builder import DynamicTreeBuilder, DynamicTreeConfig, check_dynamic_tree, dynamic_tree_refusal
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.speculative.sa.automaton import SAConfig
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod
from eagle3_trt.testing.tiny_pair import make_pair

ROOT = Path(__file__).resolve().parents[1]

# K = 2, depth 3, a draft vocabulary of 5. Root probabilities, then per expanded node its children's.
ROOT_P = [0.5, 0.28, 0.12, 0.06, 0.04]  # top-2: token 0 (0.5), token 1 (0.28)
LAYER1_P = [
    [0.1, 0.2, 0.6, 0.05, 0.05],  # after token 0: token 2 (0.5*0.6 = .30), token 1 (0.5*0.2 = .10)
    [0.04, 0.06, 0.12, 0.7, 0.08],  # after token 1: token 3 (0.28*0.7 = .196), token 2 (0.28*0.12 = .0336)
]  # expanded next: the two best of (.30, .10, .196, .0336): 0->2 (slot 0), 1->3 (slot 1)
LAYER2_P = [
    [0.9, 0.01, 0.04, 0.03, 0.02],  # after 0->2: token 0 (.30*0.9 = .27), token 2 (.012)
    [0.2, 0.5, 0.1, 0.15, 0.05],  # after 1->3: token 1 (.196*0.5 = .098), token 0 (.0392)
]
# history (index: token, score, parent index): 0: 0 .5 root | 1: 1 .28 root | 2: 2 .30 h0 | 3: 1 .10 h0 |
# 4: 3 .196 h1 | 5: 2 .0336 h1 | 6: 0 .27 h2 | 7: 2 .012 h2 | 8: 1 .098 h4 | 9: 0 .0392 h4


def _build(n: int):
    b = DynamicTreeBuilder(topk=2, batch=1)
    assert b.first(torch.tensor([ROOT_P])).tolist() == [[0, 1]]
    tok, parent_slot = b.next(torch.tensor([LAYER1_P]))
    assert tok.tolist() == [[2, 3]] and parent_slot.tolist() == [[0, 1]]
    tok, parent_slot = b.next(torch.tensor([LAYER2_P]))
    assert tok.tolist() == [[0, 1]] and parent_slot.tolist() == [[0, 1]]
    assert b.history_size == 2 + 2 * 2 * 2
    ((tree, ids),) = b.trees(n)
    return tree, ids


def test_hand_worked_tree_four_nodes():
    # the 4 best scores: h0 .5, h2 .30, h1 .28, h6 .27, in history order h0 h1 h2 h6
    tree, ids = _build(4)
    assert ids == [0, 1, 2, 0]
    assert tree.parent == (-1, -1, 0, 2)
    assert tree.depth == (1, 1, 2, 3)  # positions: root + depth


def test_hand_worked_tree_six_nodes_mask_and_walk():
    # the 6 best: + h4 .196, h3 .10 -> history order h0 h1 h2 h3 h4 h6
    tree, ids = _build(6)
    assert ids == [0, 1, 2, 1, 3, 0]
    assert tree.parent == (-1, -1, 0, 0, 1, 2)
    assert tree.depth == (1, 1, 2, 2, 2, 3)
    assert tree.children(-1) == [0, 1] and tree.children(0) == [2, 3] and tree.children(2) == [5]
    # attention among the nodes: ancestors and self (every node also sees the root and the context)
    a = tree.ancestors().int().tolist()
    assert a == [
        [1, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [0, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ]
    row = Row(prompt=[1], params=SamplingParams(), stats=RequestStats(), stop_ids=frozenset(), gen=None)
    logits = torch.zeros(7, 5)

    def walk(argmax: list[int], k_eff: int = 3):
        # argmax[0]: the target at the root, argmax[1 + i]: at node i
        return accept(row, logits, ids, [None] * 6, tree, k_eff, argmax)

    # root -> token 1 (node 1, the second root child); at node 1 -> 3 (node 4); node 4 has no children: bonus 4
    assert walk([1, 9, 3, 9, 9, 4, 9]) == ([1, 4], 4, 3)
    # root -> 0 (node 0); at node 0 -> 1: its second child (node 3); bonus = target at node 3
    assert walk([0, 1, 9, 9, 2, 9, 9]) == ([0, 3], 2, 3)
    # root -> 0 -> 2 -> 0 (nodes 0, 2, 5): all three depths; bonus at node 5
    assert walk([0, 2, 9, 0, 9, 9, 4]) == ([0, 2, 5], 4, 3)
    # the same with 2 positions left before max_tokens: depth 3 is not offered
    assert walk([0, 2, 9, 0, 9, 9, 4], k_eff=2) == ([0, 2], 0, 2)
    # no root child matches: nothing accepted, the bonus is the target's token at the root
    assert walk([4, 9, 9, 9, 9, 9, 9]) == ([], 4, 1)
    # the request's first decode: no tree is stored for it (trees are built for generation rows only),
    # so even a full match emits the target's token at the root alone (treeValid false)
    assert accept(row, logits, ids, [None] * 6, tree, 3, [1, 9, 3, 9, 9, 4, 9], tree_valid=False) == ([], 1, 1)


def test_hand_worked_sampled_walk():
    """Temperature > 0: at each visited node the target's token is a sample (here from near point
    masses, so the trace is fixed), and the child holding it is accepted (TensorRT-LLM's
    target-only rejection kernel accepts a sibling exactly when the target's draw is its token)."""
    tree, ids = _build(6)  # ids [0, 1, 2, 1, 3, 0], parents (-1, -1, 0, 0, 1, 2)
    gen = torch.Generator().manual_seed(0)
    row = Row(prompt=[1], params=SamplingParams(temperature=1.0), stats=RequestStats(), stop_ids=frozenset(), gen=gen)

    def peaked(tokens: list[int]) -> torch.Tensor:
        lg = torch.full((7, 5), -50.0)
        for i, t in enumerate(tokens):
            lg[i, t] = 50.0
        return lg

    # samples: 0 at the root (node 0), 1 at node 0 (node 3, its second child), 2 at node 3 (a leaf: the bonus)
    lg = peaked([0, 1, 4, 4, 2, 4, 4])
    assert accept(row, lg, ids, [None] * 6, tree, 3, None, match=True) == ([0, 3], 2, 3)
    # first decode: the root's sample alone
    assert accept(row, lg, ids, [None] * 6, tree, 3, None, match=True, tree_valid=False) == ([], 0, 1)


def test_ties_keep_every_parent():
    # a child as likely as its parent (p = 1) competes for the last slot: the parent (earlier index) wins
    b = DynamicTreeBuilder(topk=1, batch=1)
    b.first(torch.tensor([[0.0, 1.0, 0.0]]))
    b.next(torch.tensor([[[0.0, 0.0, 1.0]]]))
    ((tree, ids),) = b.trees(1)
    assert ids == [1] and tree.parent == (-1,)


def test_trtllm_ranges():
    assert check_dynamic_tree(10, None, 6) == 60  # TensorRT-LLM's default: topK * max_draft_len
    assert check_dynamic_tree(3, 3, 3) == 3
    for topk, total, k in ((0, None, 3), (None, None, 3), (2, 2, 3), (2, 7, 3)):
        with pytest.raises(UserError):
            check_dynamic_tree(topk, total, k)


def test_sliding_window_and_mla_targets_refused():
    cfg = {m: json.loads((ROOT / "models" / m / "target" / "config.json").read_text()) for m in ("tiny", "tiny-qwen3", "tiny-gpt-oss")}
    assert dynamic_tree_refusal(cfg["tiny"]) is None
    assert dynamic_tree_refusal(cfg["tiny-qwen3"]) is None  # sliding window off (use_sliding_window false)
    assert "sliding-window" in (dynamic_tree_refusal(cfg["tiny-gpt-oss"]) or "")
    assert "MLA" in (dynamic_tree_refusal({"model_type": "deepseek_v3", "kv_lora_rank": 512}) or "")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    t, d = make_pair(tmp_path_factory.mktemp("pair"))
    return load_engine(t, d, dtype=torch.float32, max_draft_len=3)


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[0] + [rng.randrange(6, 512) for _ in range(rng.randrange(3, 14))] for _ in range(n)]


@pytest.fixture(scope="module")
def trained():
    pair = data_dir("models") / "tiny"
    eng = load_engine(pair / "target", pair / "draft", dtype=torch.float32, max_draft_len=3)
    texts = ("x = 1\ny = 2\n" * 4, "def add(a, b):\n    return a + b\n\n" * 2, "import os\n" * 4)
    return eng, [list(eng.tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts]


def test_topk_1_is_not_the_chain(trained):
    """topK 1 drafts the chain's tokens, but TensorRT-LLM holds no tree for a request's first decode:
    that step emits exactly one token where the chain accepts drafts."""
    eng, prompts = trained
    prm = SamplingParams(max_tokens=24)
    eng.method = DynamicTreeMethod(DynamicTreeConfig(1))
    try:
        dyn = [[len(s.new_token_ids) for s in eng.stream(p, prm)] for p in prompts]
        dyn_res = eng.generate(prompts, prm)
    finally:
        eng.method = None
    chain = [[len(s.new_token_ids) for s in eng.stream(p, prm)] for p in prompts]
    chain_res = eng.generate(prompts, prm)
    assert [r.token_ids for r in dyn_res] == [r.token_ids for r in chain_res]  # greedy output either way
    assert all(steps[:2] == [1, 1] for steps in dyn)  # prefill, then the first decode: one token each
    assert any(steps[1] > 1 for steps in chain)  # where the chain's first decode accepted drafts
    for d, c in zip(dyn_res, chain_res):
        assert d.stats.accept_hist[0] >= 1  # the first decode's verification accepted nothing
        assert d.stats.target_forwards >= c.stats.target_forwards


def test_wider_tree_verifies_more_and_keeps_greedy(engine):
    prompts, prm = _prompts(6, 3), SamplingParams(max_tokens=16)
    ref = [r.token_ids for r in engine.generate(prompts, prm, speculate=False)]
    engine.method = DynamicTreeMethod(DynamicTreeConfig(3, 5))
    try:
        got = engine.generate(prompts, prm)
    finally:
        engine.method = None
    assert [r.token_ids for r in got] == ref
    for r in got:  # 5 nodes per speculative forward, fewer only in the last steps before max_tokens
        spec_forwards = r.stats.target_forwards - 1
        assert 3 * spec_forwards < r.stats.verified_tokens <= 5 * spec_forwards


def test_sampled_requests_walk_the_tree(trained):
    # temperature > 0: the tree is drafted (top-K, every node verified) and the target sampled along it
    eng, prompts = trained
    prm = SamplingParams(max_tokens=16, temperature=0.8, seed=3)
    eng.method = DynamicTreeMethod(DynamicTreeConfig(3))
    try:
        dyn = eng.generate(prompts, prm)
        again = eng.generate(prompts, prm)
        steps = [[len(s.new_token_ids) for s in eng.stream(p, prm)] for p in prompts]
    finally:
        eng.method = None
    assert [r.token_ids for r in dyn] == [r.token_ids for r in again]  # seeded
    for r in dyn:
        spec = r.stats.target_forwards - 1
        assert 3 * spec < r.stats.verified_tokens <= 9 * spec  # the tree's 9 nodes, not a chain of 3
    assert sum(r.stats.accepted_tokens for r in dyn) > 0
    assert all(s[:2] == [1, 1] for s in steps)  # no tree on the first decode at any temperature


def test_refused_combinations(engine):
    # the dynamic tree with the suffix-automaton enhancer: the options schema refuses it, and options
    # that slipped past it (model_construct skips validation) are refused by the method registry
    from pydantic import ValidationError

    from eagle3_trt.pipeline.llm_options import Eagle3Options
    from eagle3_trt.speculative.registry import method_from_options
    from eagle3_trt.speculative.sa.options import SAEnhancerOptions

    both = {"max_draft_len": 3, "use_dynamic_tree": True, "dynamic_tree_max_topK": 2, "sa_config": SAEnhancerOptions(threshold=2)}
    with pytest.raises(ValidationError, match="sa_config"):
        Eagle3Options(**both)
    with pytest.raises(UserError, match="two speculation methods"):
        method_from_options(Eagle3Options.model_construct(**both))
    assert method_from_options(Eagle3Options(max_draft_len=3, sa_config=SAEnhancerOptions(threshold=2))) == SuffixAutomatonMethod(SAConfig(threshold=2))
    engine.method = DynamicTreeMethod(DynamicTreeConfig(2))
    try:
        with pytest.raises(UserError, match="mutually exclusive"):
            engine.generate([[0, 7, 8]], SamplingParams(max_tokens=4), tree=[(0,), (1,)])
        engine.method = DynamicTreeMethod(DynamicTreeConfig(2, 9))
        with pytest.raises(UserError, match="max_total_draft_tokens"):
            engine.generate([[0, 7, 8]], SamplingParams(max_tokens=4))
    finally:
        engine.method = None
