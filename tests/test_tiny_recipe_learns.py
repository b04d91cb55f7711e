"""The embedded pair's recipe learns (issue 29): a short run of the same stages `make tiny-pairs`
runs (testing/make_tiny_pair.make: tokenizer, target pre-training on code + copy documents with a
long window, train-draft --generate, held-out measurement, model card), at tiny sizes and on a few
training files, not the full run. The target's training loss falls and the head's agreement with the
target (teacher-forced accuracy and acceptance on its held-out split) rises over training."""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.load import load_target
from eagle3_trt.convert.target import read_target
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.formats.heldout import read_heldout
from eagle3_trt.testing.make_tiny_pair import make
from eagle3_trt.testing.tiny_copy_data import MARK_AGAIN, MARK_CHANGED, copy_corpus, paste_prompts
from eagle3_trt.testing.tiny_recipe import RECIPES, read_corpus
from eagle3_trt.train.evaluate import measure_acceptance

SHORT = replace(
    RECIPES["llama"],
    vocab_size=384,
    hidden_size=48,
    num_hidden_layers=8,  # EAGLE-3's capture layers need at least 7
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=24,
    intermediate_size=96,
    max_position_embeddings=512,
    target_long_seq=512,
    long_docs=2,
    long_every=10,
    target_steps=100,
    target_batch=8,
    target_seq=64,
    target_lr=1e-2,
    draft_steps=40,
    peagle_steps=0,  # no P-EAGLE head in the short run
    draft_batch=8,
    draft_seq=96,
    draft_vocab=192,
    draft_lr=3e-3,
    draft_pieces=16,
    draft_copy_pieces=8,
    draft_gen_tokens=32,
    eval_prompts=4,
    paste_prompts=3,
    eval_prompt_len=32,
    eval_tokens=8,
    train_files=6,
)


def test_short_run_of_the_recipe_learns(tmp_path):
    facts = make(tmp_path / "pair", SHORT, log=lambda m: None)
    t = facts["target"]
    assert t["loss_by_tenth"][-1] < t["loss_by_tenth"][0] - 0.5, t["loss_by_tenth"]
    assert t["long_steps"] == 10 and t["long_windows"] == 2, t
    report = json.loads((tmp_path / "pair" / "draft" / "train_report.json").read_text())
    first, last = report["history"][0], report["history"][-1]  # the head's loss, every 10 steps
    assert last["loss"] < first["loss"], report["history"]
    # agreement with the target: greedy acceptance on the held-out prompts of the trained head against
    # the same head re-initialised (what training starts from), through the runtime's loop
    pair = tmp_path / "pair"
    ck = load_draft(pair / "draft")
    target = load_target(pair / "target", dtype=torch.float32, aux_layer_ids=ck.config.aux_layer_ids)
    trained = Eagle3Draft.from_checkpoint(ck, torch.float32)
    fresh = Eagle3Draft.from_checkpoint(ck, torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in fresh.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    prompts = read_heldout(pair).prompts
    stops = tuple(read_target(pair / "target").eos_token_ids)
    before, after = (measure_acceptance(target, d, prompts, 12, 3, stops) for d in (fresh, trained))
    assert after.per_step[0] > before.per_step[0] + 0.1 and after.acceptance_length > before.acceptance_length + 0.1, (before, after)
    acc = facts["acceptance_heldout"]
    assert set(acc["by_set"]) == {"code", "paste"} and acc["by_set"]["paste"]["prompts"] == 3
    ci = acc["interval_95"]
    assert ci["low"] <= acc["K=3"]["acceptance_length"] <= ci["high"], (ci, acc["K=3"])
    assert len(prompts) == 4 + 3
    card = (tmp_path / "pair" / "MODEL_CARD.md").read_text()
    assert "make tiny-pairs" in card and "Process CPU time" in card and "Greedy continuations that repeat the block exactly" in card
    assert facts["timings"]["cpu_s"] > 0 and facts["recipe"]["max_position_embeddings"] == 512


def test_copy_documents_are_seeded_and_copy():
    train, held, _ = read_corpus()
    texts = list(train.values())[:4]
    a = copy_corpus(texts, 0, 20_000, 1, 3_000)
    assert a == copy_corpus(texts, 0, 20_000, 1, 3_000) and a != copy_corpus(texts, 1, 20_000, 1, 3_000)
    short, (long,) = a
    assert sum(map(len, short)) >= 20_000 and len(long) >= 3_000
    assert any(MARK_AGAIN in d for d in short) and any(MARK_CHANGED in d for d in short)
    again = [d for d in short if MARK_AGAIN in d]
    # an `# again:` copy repeats, right after the marker, a block that precedes it
    assert any(d.split(MARK_AGAIN, 1)[1].splitlines()[0] in d.split(MARK_AGAIN, 1)[0] for d in again)
    for kind, prompt, block in paste_prompts(list(held.values()), 6, 0):
        assert block in prompt
        if kind == "again":
            assert prompt.endswith(block + MARK_AGAIN)
        elif kind == "pasted":
            assert prompt.endswith(block * 2)
