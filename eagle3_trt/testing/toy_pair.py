"""In-memory toy pairs for tests, benchmarks and demos (no files, no tokenizer).

``toy_engine`` builds a random target and draft with a tiny vocabulary, for statistical tests of
the sampling path; ``sharpen_target`` makes a random target's hidden states carry context so a
distilled draft (``trainer.distill_draft``) has to use them. Pairs on disk come from
``testing.tiny_pair.make_pair``.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SpeculativeEngine
from eagle3_trt.core.target import TargetModel
from eagle3_trt.formats.draft_config import DraftConfig


def sharpen_target(target: TargetModel, factor: float = 20.0) -> None:
    """Scale every layer's o_proj and down_proj of a random (tiny) target in place.

    At initialization scale (std 0.02) each layer adds almost nothing to the residual stream,
    so every layer's output is about the input embedding and the greedy next token is a
    function of the current token only: a draft then learns a bigram table and ignores the
    target's hidden states, and wrong aux layers cannot hurt it. With larger residual updates
    the layers carry context, the draft has to use them, and capturing the wrong layers shows.
    """
    with torch.no_grad():
        for layer in target.hf.model.layers:
            layer.self_attn.o_proj.weight.mul_(factor)
            layer.mlp.down_proj.weight.mul_(factor)


def toy_engine(
    vocab: int = 16,
    draft_vocab: int = 12,
    *,
    hidden: int = 32,
    layers: int = 6,
    max_draft_len: int = 2,
    target_logit_scale: float = 15.0,
    draft_logit_scale: float = 8.0,
    seed: int = 0,
    missing=(3, 7, 11, 13),
):
    """An in-memory random pair with a tiny vocabulary, for statistical tests.

    The target's lm_head is scaled so its distributions are neither uniform nor one-hot; the
    draft vocabulary leaves out the target ids in ``missing`` (q = 0 there).
    Returns (hf_model, engine).
    """
    if layers < 5:
        raise ValueError("toy_engine needs at least 5 layers for three distinct aux layers")
    heads, kv, hd = 4, 2, hidden // 4
    aux = (1, layers // 2, layers - 2)
    torch.manual_seed(seed)
    hf, target = _toy_target(vocab, hidden, layers, heads, kv, hd, aux, target_logit_scale)
    torch.manual_seed(seed + 1)
    draft = _toy_draft(vocab, draft_vocab, hidden, heads, kv, hd, aux, draft_logit_scale, missing)
    eng = SpeculativeEngine(target, draft, None, max_draft_len=max_draft_len, eos_token_ids=(), max_seq_len=256)
    return hf, eng


def _toy_target(vocab: int, hidden: int, layers: int, heads: int, kv: int, hd: int, aux: tuple[int, ...], logit_scale: float):
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hd,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(logit_scale)
    return hf, TargetModel(hf, aux, cfg.to_dict())


def _toy_draft(vocab: int, draft_vocab: int, hidden: int, heads: int, kv: int, hd: int, aux: tuple[int, ...], logit_scale: float, missing) -> Eagle3Draft:
    dc = DraftConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hd,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=256,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=hidden,
        aux_layer_ids=aux,
        num_aux_layers=len(aux),
        torch_dtype="float32",
        source_format="toy",
    )
    draft = Eagle3Draft(dc).eval()
    kept = torch.tensor([i for i in range(vocab) if i not in set(missing)][:draft_vocab])
    with torch.no_grad():
        draft.get_buffer("d2t").copy_(kept - torch.arange(draft_vocab))
        draft.lm_head.weight.mul_(logit_scale)
    return draft
