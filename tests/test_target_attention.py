"""The target's fast paths compute what transformers computes.

- GQA-aware SDPA (no K/V expansion per query head) is bit-identical to transformers' own SDPA.
- The preallocated KV cache (in-place appends) decodes bit-identically to ``DynamicCache``.
- Column windows (attention per run of similar prompt lengths, skipping the others' left padding)
  give the same greedy tokens and aux states to float tolerance.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from eagle3_trt.convert.load import load_target
from eagle3_trt.core.target import GQA_ATTENTION, TargetModel, attention_implementation, column_windows
from eagle3_trt.testing.tiny_pair import TinyShape, make_pair


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    # GQA (4 query heads over 2 KV heads) as in the tiny pair
    t, _ = make_pair(tmp_path_factory.mktemp("pair"), TinyShape(num_hidden_layers=4))
    return load_target(t, dtype=torch.float32, aux_layer_ids=(0, 1, 3)), t


def _left_padded(prompts: list[list[int]]):
    S = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), S, dtype=torch.long)
    valid = torch.zeros(len(prompts), S, dtype=torch.bool)
    for r, p in enumerate(prompts):
        ids[r, S - len(p) :] = torch.tensor(p)
        valid[r, S - len(p) :] = True
    pos = (valid.cumsum(-1) - 1).clamp(min=0)
    allowed = torch.tril(torch.ones(S, S, dtype=torch.bool))[None] & valid[:, None, :]
    allowed |= torch.eye(S, dtype=torch.bool)[None]
    return ids, pos, allowed, valid


def _decode(tm: TargetModel, prompts, steps: int, prealloc: bool, windows=None):
    ids, pos, allowed, valid = _left_padded(prompts)
    cache = tm.new_cache()
    logits, _ = tm.forward(ids, pos, allowed, cache, logits_at=torch.full((len(prompts), 1), ids.shape[1] - 1))
    if prealloc:
        layers = cache.layers
        cache = tm.preallocated_cache([([lay.keys for lay in layers], [lay.values for lay in layers])], ids.shape[1] + steps)
    nxt = logits[:, 0].argmax(-1)
    last = pos[:, -1]
    out_tok, out_aux, out_logits = [], [], []
    for s in range(steps):
        valid = torch.cat([valid, torch.ones(len(prompts), 1, dtype=torch.bool)], dim=1)
        with column_windows(windows) if windows else contextlib.nullcontext():
            lg, aux = tm.forward(nxt[:, None], (last + 1 + s)[:, None], valid[:, None, :], cache)
        nxt = lg[:, 0].argmax(-1)
        out_tok.append(nxt)
        out_aux.append(aux)
        out_logits.append(lg)
    return torch.stack(out_tok, 1), torch.cat(out_aux, 1), torch.cat(out_logits, 1)


def test_gqa_attention_is_bit_identical_to_transformers_sdpa(target):
    tm, path = target
    if attention_implementation() != GQA_ATTENTION:
        pytest.skip("torch without enable_gqa: the runtime uses transformers' sdpa itself")
    assert tm.hf.config._attn_implementation == GQA_ATTENTION
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa").eval()
    assert ref.config.num_key_value_heads < ref.config.num_attention_heads  # the expanded path is the one compared
    prompts = [[0, 7, 9, 30, 41], [0] + list(range(10, 40)), [0, 300, 200]]
    ids, pos, allowed, _ = _left_padded(prompts)
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)[:, None]
    with torch.no_grad():
        want = ref.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        got = tm.hf.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
    assert torch.equal(got, want)


def test_preallocated_cache_decodes_like_dynamic_cache(target):
    tm, _ = target
    prompts = [[0, 5, 9, 300, 41, 17], [0] + list(range(50, 90)), [0, 77]]
    a = _decode(tm, prompts, 12, prealloc=False)
    b = _decode(tm, prompts, 12, prealloc=True)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_preallocated_cache_keeps_rows_and_refuses_overflow(target):
    tm, _ = target
    k = torch.randn(3, 2, 4, 16)
    cache = tm.preallocated_cache([([k.clone()], [k.clone()])], 5)
    cache.keep_rows(torch.tensor([0, 2]))
    kk, _ = cache.update(torch.ones(2, 2, 1, 16), torch.ones(2, 2, 1, 16), 0)
    assert kk.shape == (2, 2, 5, 16) and torch.equal(kk[1, :, :4], k[2]) and cache.get_seq_length() == 5
    with pytest.raises(RuntimeError, match="full"):
        cache.update(torch.ones(2, 2, 1, 16), torch.ones(2, 2, 1, 16), 0)


def test_preallocated_cache_stacks_groups_left_padded(target):
    tm, _ = target
    a, b = torch.randn(2, 2, 3, 16), torch.randn(1, 2, 5, 16)
    parts = [([a.clone()], [a.clone() + 1]), ([b.clone()], [b.clone() + 1])]
    cache = tm.preallocated_cache(parts, 8)
    assert parts[0][0] == [None] and parts[1][1] == [None]  # the groups' copies were released
    kk, vv = cache.update(torch.zeros(3, 2, 1, 16), torch.zeros(3, 2, 1, 16), 0)
    assert kk.shape == (3, 2, 6, 16)
    assert torch.equal(kk[:2, :, 2:5], a) and not kk[:2, :, :2].any() and torch.equal(vv[2:, :, :5], b + 1)


def test_column_windows_change_nothing_but_the_work(target):
    tm, _ = target
    if attention_implementation() != GQA_ATTENTION:
        pytest.skip("windows apply only with the GQA attention")
    prompts = [[0, 5, 9], [0, 8, 100, 4], [0] + list(range(20, 80)), [0] + list(range(100, 170))]
    S = max(len(p) for p in prompts)
    windows = [(0, 2, S - 4), (2, 4, 0)]  # rows 0-1 read only their own 4 columns and the decode's
    t0, a0, l0 = _decode(tm, prompts, 10, prealloc=True)
    t1, a1, l1 = _decode(tm, prompts, 10, prealloc=True, windows=windows)
    assert torch.equal(t0, t1)
    torch.testing.assert_close(a1, a0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-5)
