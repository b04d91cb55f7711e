"""A model's size from its config.json alone: the shape, parameter counts, and bytes per weight format.

Arithmetic on Hugging Face config fields, so it runs on any machine, without weights, torch or
TensorRT-LLM; the planner (pipeline/planner.py) and the cost model (measure/cost_model.py) build on it.
Bytes are exact integers and printed as decimal GB (1e9), except per-token KV sizes, which are
printed in KiB.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import EAGLE3_DEFAULT_NUM_AUX, LLAMA, family_of_config
from eagle3_trt.formats.hf_config import LlamaConfigFields, parse_config

# Bytes per weight of the quantized Linear layers. NVFP4 packs two e2m1 values per byte and adds
# one e4m3 scale per 16 weights: 4 + 8/16 = 4.5 bits. FP8 and NVFP4 also carry per-tensor
# scales (weight_scale_2, input_scale), a few bytes per Linear, ignored here.
LINEAR_BYTES: dict[str, float] = {
    "bf16": 2.0,
    "fp8": 1.0,
    "nvfp4": 0.5 + 1 / 16,
    # MXFP4 (OCP MX): two e2m1 values per byte, one e8m0 scale per 32 weights
    "mxfp4": 0.5 + 1 / 32,
}
# ModelOpt leaves embeddings, lm_head and norms in BF16 (its default disabled quantizers).
BF16_BYTES = 2
KV_BYTES: dict[str, int] = {"bf16": 2, "fp8": 1}
# One-model EAGLE-3 captures three target layers by default (convert/families.py)
EAGLE3_CAPTURED_LAYERS = EAGLE3_DEFAULT_NUM_AUX

GB = 1e9
KIB = 1024


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(path, "config.json not found", "point at a checkpoint directory that has one") from None
    except json.JSONDecodeError as e:
        raise UserError(path, f"not valid JSON: {e}", "fix or re-download the file") from None
    if not isinstance(data, dict):
        raise UserError(path, "expected a JSON object", "pass a Hugging Face config.json")
    return data


@dataclass(frozen=True)
class LlamaShape:
    """The fields of a decoder's config.json that size a model (any family of convert/families.py)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    max_positions: int
    norms_per_layer: int  # RMSNorm weights per decoder layer (the family's: Qwen3 adds q/k norms)
    family: str = "llama"
    # mixture of experts (0 = dense MLP): experts per layer and experts each token runs through
    experts: int = 0
    active_experts: int = 0
    # layers with sliding-window attention (layer_types "sliding_attention") and their window
    window_layers: int = 0
    sliding_window: int = 0
    attn_bias: bool = False  # q/k/v/o biases (gpt-oss)
    sinks: bool = False  # one attention-sink logit per query head per layer (gpt-oss)
    quant_method: str | None = None  # config.json quantization_config.quant_method of a shipped-quantized target
    native_formats: tuple[str, ...] = ()  # the family's formats TensorRT-LLM loads as shipped


def parse_shape(cfg: dict[str, Any], where: str = "config.json") -> LlamaShape:
    """The shape of a config, read through the one config schema (convert/hf_config.py) that validate
    and engine use, so a config gets the same answer (or the same one-line error) here. The family
    (convert/families.py) gives head_dim's default and the norms; a config without model_type is an
    EAGLE-3 head's layer, which is Llama-style whatever the target."""
    f = parse_config({k: v for k, v in cfg.items() if k != "pad_token_id"}, where, LlamaConfigFields, required=("num_hidden_layers",))
    fam = family_of_config(cfg, where) if cfg.get("model_type") else LLAMA
    head_dim = f.head_dim or fam.head_dim(cfg)
    experts = int(getattr(f, fam.moe_experts_field) or 0) if fam.moe_experts_field else 0
    active = int(getattr(f, fam.moe_active_field) or 0) if fam.moe_active_field and experts else 0
    if experts and not active:
        raise UserError(f"{where}:{fam.moe_active_field}", "missing for a mixture-of-experts target", "copy the checkpoint's config.json as published")
    window_layers = sum(t == "sliding_attention" for t in f.layer_types or ()) if f.sliding_window else 0
    return LlamaShape(
        hidden=f.hidden_size,
        layers=f.num_hidden_layers,
        heads=f.num_attention_heads,
        kv_heads=f.kv_heads,
        head_dim=head_dim,
        intermediate=f.intermediate_size,
        vocab=f.vocab_size,
        tied_embeddings=f.tie_word_embeddings,
        max_positions=f.max_position_embeddings or 0,
        norms_per_layer=fam.norm_params_per_layer(f.hidden_size, head_dim),
        family=fam.name,
        experts=experts,
        active_experts=active,
        window_layers=window_layers,
        sliding_window=f.sliding_window or 0 if window_layers else 0,
        attn_bias=f.attention_bias,
        sinks=fam.attention_sinks,
        quant_method=(f.quantization_config or {}).get("quant_method"),
        native_formats=fam.native_quant_methods,
    )


@dataclass(frozen=True)
class TargetParams:
    embed: int
    lm_head: int  # 0 when tied to the embedding
    attn_per_layer: int  # q, k, v, o
    mlp_per_layer: int  # gate, up, down
    norms_per_layer: int  # input and post-attention RMSNorm (+ per-head q/k norms in Qwen3)
    final_norm: int
    layers: int
    linear: int  # all attention + MLP weights: the part that gets quantized
    norms: int
    total: int
    # MoE: the experts' matrices per layer (inside mlp_per_layer; the part an MXFP4 checkpoint ships in MXFP4)
    expert_weights_per_layer: int = 0
    # biases, the router and attention sinks per layer (inside attn/mlp_per_layer): kept BF16 by every format
    bf16_per_layer: int = 0
    experts: int = 0
    active_experts: int = 0
    # parameters a token runs through, without the embedding table (a lookup): OpenAI's "active" count
    active: int = 0
    native_format: str | None = None  # the shipped format of an already-quantized target (--quant native)


def count_target(s: LlamaShape) -> TargetParams:
    q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = s.hidden * q_out + 2 * s.hidden * kv_out + q_out * s.hidden
    mlp = 3 * s.hidden * s.intermediate
    bf16 = 0
    expert_weights = 0
    if s.attn_bias:
        bf16 += q_out + 2 * kv_out + s.hidden
    if s.sinks:
        bf16 += s.heads
    if s.experts:
        # each expert: fused gate/up [2I, H] + down [H, I] with biases 2I and H; the router [E, H] + bias E
        # (transformers' GptOssExperts / GptOssTopKRouter, TensorRT-LLM's MLPBlock: gate Linear(bias=True))
        expert_weights = s.experts * 3 * s.hidden * s.intermediate
        bf16 += s.experts * (2 * s.intermediate + s.hidden) + s.experts * s.hidden + s.experts
        mlp = expert_weights
    attn_all = attn + (q_out + 2 * kv_out + s.hidden if s.attn_bias else 0) + (s.heads if s.sinks else 0)
    mlp_all = attn + mlp + bf16 - attn_all
    embed = s.vocab * s.hidden
    lm_head = 0 if s.tied_embeddings else embed
    linear = s.layers * (attn + mlp)
    norms = s.layers * s.norms_per_layer + s.hidden
    total = s.layers * (attn_all + mlp_all) + norms + embed + lm_head
    per_expert = 3 * s.hidden * s.intermediate + 2 * s.intermediate + s.hidden
    inactive = s.layers * (s.experts - s.active_experts) * per_expert if s.experts else 0
    native = s.quant_method if s.quant_method in s.native_formats else None
    if native is not None and native not in LINEAR_BYTES:
        raise UserError("config.json:quantization_config.quant_method", f"{native!r} has no byte size in the planner", "add it to LINEAR_BYTES")
    return TargetParams(
        embed=embed,
        lm_head=lm_head,
        attn_per_layer=attn_all,
        mlp_per_layer=mlp_all,
        norms_per_layer=s.norms_per_layer,
        final_norm=s.hidden,
        layers=s.layers,
        linear=linear,
        norms=norms,
        total=total,
        expert_weights_per_layer=expert_weights,
        bf16_per_layer=bf16,
        experts=s.experts,
        active_experts=s.active_experts,
        active=total - inactive - (embed if lm_head else 0),
        native_format=native,
    )


@dataclass(frozen=True)
class DraftParams:
    fc: int  # [H, captured_layers * target_hidden]: fuses the captured target hidden states
    attn: int  # first layer's q/k/v read 2H (embedding + fused hidden), o writes H
    mlp: int
    norms: int  # input, hidden and post-attention norms per layer, plus the final norm
    lm_head: int  # [draft_vocab, H]
    draft_vocab: int
    d2t: int  # draft-to-target id offsets, int32 on the GPU
    total: int  # parameters excluding d2t
    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int


def count_draft(cfg: dict[str, Any], target: LlamaShape, where: str = "draft config.json") -> DraftParams:
    s = parse_shape(cfg, where)
    target_hidden = int(cfg.get("target_hidden_size") or target.hidden)
    draft_vocab = int(cfg.get("draft_vocab_size") or s.vocab)
    q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attn = 0
    for layer in range(s.layers):
        # Only the first EAGLE-3 layer sees [embedding, fused hidden]; later ones see H.
        q_in = 2 * s.hidden if layer == 0 else s.hidden
        attn += q_in * q_out + 2 * q_in * kv_out + q_out * s.hidden
    fc = s.hidden * EAGLE3_CAPTURED_LAYERS * target_hidden
    mlp = s.layers * 3 * s.hidden * s.intermediate
    norms = s.layers * 3 * s.hidden + s.hidden
    lm_head = draft_vocab * s.hidden
    d2t = draft_vocab if draft_vocab != s.vocab else 0
    return DraftParams(
        fc=fc,
        attn=attn,
        mlp=mlp,
        norms=norms,
        lm_head=lm_head,
        draft_vocab=draft_vocab,
        d2t=d2t,
        total=fc + attn + mlp + norms + lm_head,
        layers=s.layers,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        max_positions=s.max_positions,
    )


def moe_cost_inputs(s: LlamaShape, expert_format: str) -> dict | None:
    """What the cost model needs of a MoE target (measure/cost_model.py ``model_cost(moe=...)``): its experts,
    those a token uses, and the experts' parameters and bytes in ``expert_format``; None for a dense target."""
    if not s.experts:
        return None
    p = count_target(s)
    expert_params = s.layers * p.expert_weights_per_layer
    return {
        "experts": s.experts,
        "active_experts": s.active_experts,
        "expert_params": expert_params,
        "expert_bytes": expert_params * LINEAR_BYTES[expert_format],
    }


def gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


def bparams(n: int) -> str:
    return f"{n / 1e9:.2f} B"
