"""A P-EAGLE head written as speculators 0.9 saves one (what vLLM serves and ``checkpoint.load_peagle``
reads back): config.json with ``speculators_model_type: peagle`` and the EAGLE-3 fields around the
nested Llama ``transformer_layer_config``; model.safetensors with speculators' names.

Layout read from a head speculators 0.9.0 itself saves (``PEagleDraftModel.save_pretrained``, see
tests/test_peagle_logits.py ``peagle_head``): tensors ``fc.weight``, ``layers.{i}.*`` (layer 0's
``hidden_norm``; a later layer's ``input_layernorm`` is the draft core's ``midlayer.{i}.hidden_norm``),
``norm.weight``, ``lm_head.weight``, ``embed_tokens.weight``, ``mask_hidden``, ``d2t``/``t2d`` for a
reduced vocabulary; aux layer ids in vLLM's numbering (TensorRT-LLM's + 1, formats/draft_config.py);
K as ``speculators_config.proposal_methods[0].speculative_tokens`` (vLLM's ``num_speculative_tokens``).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from eagle3_trt.formats.draft_config import DraftConfig, trtllm_config
from eagle3_trt.speculative.peagle.draft import PEagleDraft

_MID = re.compile(r"^midlayer\.(?:(\d+)\.)?(.*)$")
# the flat EAGLE-3 keys that are top-level (or absent) in a speculators config, not in its layer config
_NOT_LAYER_KEYS = ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config", "torch_dtype", "fc_norm", "bias")


def speculators_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The draft core's names (``midlayer[.i].*``) as speculators saves them (``layers.{i}.*``):
    the inverse of ``formats.draft_layer_names.trtllm_layer_names``."""
    out = {}
    for k, v in tensors.items():
        m = _MID.match(k)
        if m is not None:
            i, rest = int(m.group(1) or 0), m.group(2)
            if i >= 1 and rest == "hidden_norm.weight":
                rest = "input_layernorm.weight"
            k = f"layers.{i}.{rest}"
        out[k] = v
    return out


def speculators_config(cfg: DraftConfig, token_ids: dict[str, Any], mask_token_id: int, k: int, verifier: str) -> dict[str, Any]:
    """config.json of the head: speculators 0.9.0's ``PEagleSpeculatorConfig`` fields."""
    flat = trtllm_config(cfg, token_ids)  # the one writer of the layer fields and rope block
    layer = {key: v for key, v in flat.items() if key not in _NOT_LAYER_KEYS}
    layer["model_type"] = "llama"
    return {
        "architectures": ["PEagleDraftModel"],
        "auto_map": {"": "config.PEagleSpeculatorConfig"},
        "draft_vocab_size": cfg.draft_vocab_size,
        "dtype": "bfloat16",
        "eagle_aux_hidden_state_layer_ids": None if cfg.aux_layer_ids is None else [i + 1 for i in cfg.aux_layer_ids],
        "embed_requires_grad": True,
        "fc_norm": cfg.fc_norm,
        "mask_token_id": int(mask_token_id),
        "norm_before_fc": cfg.norm_before_fc,
        "norm_before_residual": False,
        "norm_output": cfg.return_hidden_post_norm,
        "speculators_config": {
            "algorithm": "peagle",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": int(k), "verifier_accept_k": 1}],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": verifier},
        },
        "speculators_model_type": "peagle",
        "speculators_version": "0.9.0",
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer,
    }


def speculators_tensors(draft: PEagleDraft, d2t: torch.Tensor | None, t2d: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The head's tensors under speculators' names, in bf16 (d2t int64, t2d bool: only for a reduced vocabulary)."""
    sd = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in draft.state_dict().items() if k != "d2t"}
    out = speculators_names(sd)
    if d2t is not None and t2d is not None:
        out["d2t"], out["t2d"] = d2t.to(torch.int64).contiguous(), t2d.to(torch.bool).contiguous()
    return out


__all__ = ["speculators_config", "speculators_names", "speculators_tensors"]
