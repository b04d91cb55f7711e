"""The induction circuit the embedded Llama target starts from (testing/induction_seed.py, issue 29):
before any training, the seeded model continues a random token sequence it has seen once, from
hundreds to thousands of tokens back; the same model unseeded does not. And the positional weights
separate the wanted offset from every other one in the context."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from eagle3_trt.testing import tiny_training
from eagle3_trt.testing.induction_seed import layout_for, offset_weights, seed_induction
from eagle3_trt.testing.tiny_recipe import RECIPES

R = RECIPES["llama"]
IDS = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<|eot_id|>": 4, "<|finetune_right_pad_id|>": 5}


def _model(seeded: bool, r=R):
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(tiny_training.target_config(r, IDS)).float().eval()
    if seeded:
        seed_induction(m, 0)
    return m


def _copy_accuracy(model, length: int, vocab: int) -> float:
    """Greedy next-token accuracy over the second copy of a random sequence repeated once."""
    g = torch.Generator().manual_seed(length)
    seg = torch.randint(16, vocab, (length,), generator=g)
    x = seg.repeat(2)[None]
    with torch.no_grad():
        pred = model(input_ids=x).logits[0, :-1].argmax(-1)
    return float((pred[length:] == x[0, length + 1 :]).float().mean())


@pytest.mark.parametrize("length", [64, 1000, 2000])
def test_the_seeded_target_copies_before_training(length):
    assert R.induction_seed and R.max_position_embeddings >= 2 * length
    assert _copy_accuracy(_model(True), length, R.vocab_size) > 0.9
    assert _copy_accuracy(_model(False), length, R.vocab_size) < 0.05


def test_the_offset_weights_peak_where_asked():
    theta, hd, ctx = R.rope_theta, R.head_dim, R.max_position_embeddings
    w = offset_weights(theta, hd, ctx)
    freqs = theta ** (-np.arange(hd // 2) * 2.0 / hd)
    score = (w[None] * np.cos(np.outer(np.arange(ctx) - 1.0, freqs))).sum(1)
    others = np.delete(score, 1)
    assert score[1] - others.max() == pytest.approx(1.0, abs=1e-6)  # margin 1, by construction
    assert np.argmax(score) == 1


def test_a_residual_too_narrow_for_the_layout_is_refused():
    narrow = replace(R, hidden_size=96, intermediate_size=192)  # 2*24 + 2*8 + 1 fits; 2 layers needed too
    seed_induction(_model(False, narrow), 0)
    with pytest.raises(ValueError, match="induction seed"):
        seed_induction(_model(False, replace(R, num_hidden_layers=1)), 0)
    assert layout_for(192, 64).code == 48 and layout_for(192, 64).match == 16


def test_the_recipe_states_the_seed_in_its_card_facts():
    # make_tiny_pair records the recipe (asdict) in tiny_pair.json: the shipped card says it was seeded
    import json

    facts = json.loads((Path(__file__).resolve().parents[1] / "models" / "tiny" / "tiny_pair.json").read_text())
    assert facts["recipe"]["induction_seed"] is True


def test_the_shipped_target_copies_a_pasted_block():
    """The committed models/tiny target, trained from the seed, still copies: given a held-out pasted
    block and the copy's first two tokens, it predicts most later tokens of the copy from the exact text
    before each (the target before the seed: 16%)."""
    from eagle3_trt.convert.load import load_target
    from eagle3_trt.testing.tiny_copy_data import paste_prompts
    from eagle3_trt.testing.tiny_recipe import read_corpus
    from eagle3_trt.testing.tiny_training import teacher_forced_copy_accuracy
    from eagle3_trt.train.data import Encoder
    from eagle3_trt.train.hidden_states import target_tokenizer

    target_dir = Path(__file__).resolve().parents[1] / "models" / "tiny" / "target"
    tok = target_tokenizer(target_dir)
    target = load_target(target_dir, dtype=torch.float32, aux_layer_ids=[1, 3, 4])
    _, held, _ = read_corpus()
    cases = [(t, b) for k, t, b in paste_prompts(list(held.values()), 12, R.seed) if k != "changed"]
    enc = Encoder(tok, R.draft_seq, R.eval_prompt_len)
    acc = teacher_forced_copy_accuracy(target, tok, [enc.text_ids(t) for t, _ in cases], [b for _, b in cases])
    assert acc > 0.6, acc
