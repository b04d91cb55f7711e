"""The committed embedded pair (models/tiny): layout, size budget, and a real acceptance gain on
held-out standard-library text (a subset of the prompts its model card was measured on)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.target import read_target

PAIR = Path(__file__).resolve().parent.parent / "models" / "tiny"


def test_layout_and_size_budget():
    files = [p for p in PAIR.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 20 * 2**20
    assert not [p for p in files if p.suffix in (".bin", ".pt", ".pth", ".pkl")]  # safetensors only
    info = read_target(PAIR / "target")
    assert info.model_type == "llama" and info.num_hidden_layers >= 8 and info.torch_dtype == "bfloat16"
    assert (PAIR / "target" / "tokenizer.json").is_file() and (PAIR / "target" / "tokenizer_config.json").is_file()
    ck = load_draft(PAIR / "draft")
    cfg = json.loads((PAIR / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and ck.config.source_format == "safeailab"
    assert ck.config.aux_layer_ids == info.default_aux_layers()
    assert all(t.dtype == torch.bfloat16 for k, t in ck.tensors.items() if k not in ("d2t", "t2d"))
    ids = torch.arange(ck.config.draft_vocab_size) + ck.tensors["d2t"]
    assert torch.equal(ids, torch.nonzero(ck.tensors["t2d"]).flatten())
    tok = json.loads((PAIR / "target" / "tokenizer_config.json").read_text())
    assert "<|start_header_id|>" in tok["chat_template"] and tok["eos_token"] == "<|eot_id|>"
    # the tokenizer's limit is the target's (transformers warns on prompts past it)
    assert tok["model_max_length"] == info.max_position_embeddings == 4096, tok["model_max_length"]


def test_card_states_the_recorded_figure():
    facts = json.loads((PAIR / "tiny_pair.json").read_text())
    al = facts["acceptance_heldout"][f"K={facts['recipe']['max_draft_len']}"]["acceptance_length"]
    card = (PAIR / "MODEL_CARD.md").read_text()
    m = re.search(r"held-out text: ([0-9.]+) tokens per target pass", card)
    assert m and float(m.group(1)) == round(al, 2) and al >= 1.8


def test_heldout_acceptance_is_real():
    from eagle3_trt.convert.load import load_target
    from eagle3_trt.core.draft import Eagle3Draft
    from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
    from eagle3_trt.testing.tiny_recipe import Recipe, read_corpus
    from eagle3_trt.train.data import Encoder, Record, eval_prompts
    from eagle3_trt.train.evaluate import measure_acceptance, torch_threads
    from eagle3_trt.train.hidden_states import target_tokenizer

    r = Recipe()
    _, held, _ = read_corpus()
    info = read_target(PAIR / "target")
    ck = load_draft(PAIR / "draft")
    target = load_target(PAIR / "target", dtype=torch.float32, aux_layer_ids=ck.config.aux_layer_ids)
    draft = Eagle3Draft.from_checkpoint(ck, torch.float32)
    enc = Encoder(target_tokenizer(PAIR / "target"), r.draft_seq, r.eval_prompt_len)
    windows = [w for text in held.values() for w in enc.windows(Record(text=text))]
    prompts = eval_prompts(windows, 8, r.eval_prompt_len, r.seed)
    stops = tuple(info.eos_token_ids)
    with torch_threads(1):
        rep = measure_acceptance(target, draft, prompts, 48, 3, stops)
        eng = SpeculativeEngine(target, draft, max_draft_len=3, eos_token_ids=stops)
        params = SamplingParams(max_tokens=48)
        assert eng.generate([prompts[0]], params)[0].token_ids == eng.generate([prompts[0]], params, speculate=False)[0].token_ids
    assert rep.acceptance_length >= 1.5, rep
    assert rep.per_step[0] >= 0.4, rep
