"""The one table of target families: what differs between Llama, Qwen3, ... for every stage.

Each stage asks this table instead of branching on ``model_type``: reading and validating a
target (convert/target.py, convert/validate.py), the reference runtime's model class
(core/target.py), the planner's parameter counts (build/planner.py) and ModelOpt's exclusions
(convert/quantize.py). Adding a family (Llama 4, DeepSeek) means one more ``Family``
entry in ``FAMILIES`` plus its tests; a field a new family needs (MoE expert counts, sliding
windows, an already-quantized checkpoint format) is added to ``Family`` with a default that
keeps the existing entries as they are.

Every entry names the TensorRT-LLM source it follows. Facts common to all entries today:

- Aux layers: TensorRT-LLM has no per-architecture default for EAGLE-3 capture; with no
  ``eagle3_layers_to_capture`` every target gets {1, L//2 - 1, L - 4}
  (``Eagle3OneModelSpecMetadata.__post_init__``, tensorrt_llm/_torch/speculative/eagle3.py @
  f933a608045a46426792263617475b359d568043, the same in 001e6700). Id i is the output of decoder
  layer i: Llama and Qwen3 decoder layers both call ``spec_metadata.maybe_capture_hidden_states(
  self.layer_idx, hidden_states, residual)`` after their MLP (modeling_llama.py; modeling_qwen3.py
  @ 010bb95fbad3c678792a9edf659970299a1a320b).
- The draft: an EAGLE-3 head is a Llama-style layer whatever the target (``Eagle3DraftModel``,
  modeling_speculative.py @ 00679c66c3e38f6d2651ad0a5bef0f94d862e36c; public Qwen3 heads ship
  ``"model_type": "llama"``, e.g. Tencent/AngelSlim configs/qwen3-8b-eagle3.json @ 1c786f25).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from eagle3_trt.errors import UserError


def trtllm_default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """TensorRT-LLM's default ``eagle3_layers_to_capture`` for a target of ``num_layers`` decoder
    layers: the outputs of layers {1, L//2 - 1, L - 4} (0-based), as ``Eagle3OneModelSpecMetadata``
    in TensorRT-LLM's ``tensorrt_llm/_torch/speculative/eagle3.py`` sets ``layers_to_capture`` when
    the draft config names none (targets deeper than 5 layers)."""
    L = int(num_layers)
    return (1, L // 2 - 1, L - 4)


# how many target layers TensorRT-LLM captures when the draft config lists none (the rule above)
EAGLE3_DEFAULT_NUM_AUX = 3

# aux-layer default rules by name (a family names one; a new rule is one more entry)
AUX_RULES = {"trtllm_default": trtllm_default_aux_layers}

# ---- the tensors of one decoder layer, as data ------------------------------------------------
# Shapes are written in symbols of config.json: H hidden_size, I intermediate_size, D head_dim,
# N attention heads, Q = N x D, KV = kv heads x D, E experts; "2I", "H/32", "I/32" and integer
# literals too (``layer_shape_symbols``). convert/validate.py checks every layer of a checkpoint's
# safetensors headers against its family's table before anything is loaded.
Shape = tuple[str, ...]
MX_BLOCK = 32  # weights per shared exponent in an MX format (MXFP4): input widths must be multiples of it
NORMS: dict[str, Shape] = {"input_layernorm.weight": ("H",), "post_attention_layernorm.weight": ("H",)}
ATTENTION: dict[str, Shape] = {
    "self_attn.q_proj.weight": ("Q", "H"),
    "self_attn.k_proj.weight": ("KV", "H"),
    "self_attn.v_proj.weight": ("KV", "H"),
    "self_attn.o_proj.weight": ("H", "Q"),
}
ATTENTION_BIAS: dict[str, Shape] = {
    "self_attn.q_proj.bias": ("Q",),
    "self_attn.k_proj.bias": ("KV",),
    "self_attn.v_proj.bias": ("KV",),
    "self_attn.o_proj.bias": ("H",),
}
DENSE_MLP: dict[str, Shape] = {"mlp.gate_proj.weight": ("I", "H"), "mlp.up_proj.weight": ("I", "H"), "mlp.down_proj.weight": ("H", "I")}
QK_NORM: dict[str, Shape] = {"self_attn.q_norm.weight": ("D",), "self_attn.k_norm.weight": ("D",)}
# gpt-oss MoE as transformers writes it in BF16 (GptOssTopKRouter, GptOssExperts: x @ W, gate/up interleaved)
GPT_OSS_MOE: dict[str, Shape] = {
    "self_attn.sinks": ("N",),
    "mlp.router.weight": ("E", "H"),
    "mlp.router.bias": ("E",),
    "mlp.experts.gate_up_proj": ("E", "H", "2I"),
    "mlp.experts.gate_up_proj_bias": ("E", "2I"),
    "mlp.experts.down_proj": ("E", "I", "H"),
    "mlp.experts.down_proj_bias": ("E", "H"),
}
# ... and as openai/gpt-oss-{20b,120b} ship it (convert/mxfp4.py: uint8 blocks [E, out, in/32, 16] and
# E8M0 scales [E, out, in/32]): each dense expert matrix replaced by its two tensors
GPT_OSS_MXFP4: dict[str, dict[str, Shape]] = {
    "mlp.experts.gate_up_proj": {"mlp.experts.gate_up_proj_blocks": ("E", "2I", "H/32", "16"), "mlp.experts.gate_up_proj_scales": ("E", "2I", "H/32")},
    "mlp.experts.down_proj": {"mlp.experts.down_proj_blocks": ("E", "H", "I/32", "16"), "mlp.experts.down_proj_scales": ("E", "H", "I/32")},
}


def layer_shape_symbols(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, experts: int) -> dict[str, int]:
    """The values of the symbols the layer tables use, for one config."""
    return {
        "H": hidden,
        "I": intermediate,
        "2I": 2 * intermediate,
        "D": head_dim,
        "N": heads,
        "Q": heads * head_dim,
        "KV": kv_heads * head_dim,
        "E": experts,
        "H/32": hidden // MX_BLOCK,
        "I/32": intermediate // MX_BLOCK,
    }


def resolve_shape(shape: Shape, symbols: dict[str, int]) -> tuple[int, ...]:
    return tuple(symbols[d] if d in symbols else int(d) for d in shape)


class Family(BaseModel):
    """One target family's differences from a plain Llama decoder, as data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model_types: tuple[str, ...] = Field(description="config.json model_type values of this family")
    architectures: tuple[str, ...] = Field(description="config.json architectures[0] values (TensorRT-LLM's registered classes)")
    hf_class: str = Field(description="the transformers class the reference runtime and ModelOpt build")
    hf_config_class: str = Field(description="its transformers config class")
    aux_rule: Literal["trtllm_default"] = "trtllm_default"
    # per-head RMSNorm on q and k before rope (weights [head_dim] named self_attn.q_norm / k_norm)
    qk_norm: bool = False
    # head_dim when config.json omits it: None = hidden_size // num_attention_heads (Llama);
    # transformers' Qwen3Config defaults to 128 whatever the hidden size (4.57.3 and 5.x, checked)
    default_head_dim: int | None = None
    # Every tensor of one decoder layer of a complete checkpoint, with its shape in symbols (table above)
    layer_tensors: dict[str, Shape] = {**ATTENTION, **DENSE_MLP, **NORMS}
    # A natively quantized checkpoint (--quant native): per quant_method, the layer tensors it ships in
    # place of a dense one (dense name -> {shipped name: shape})
    native_layer_tensors: dict[str, dict[str, dict[str, Shape]]] = {}
    # ModelOpt quantizer patterns to disable beyond the ones every family gets (lm_head, embeddings)
    quant_exclude: tuple[str, ...] = ()
    # config.json flags this family's TensorRT-LLM model does not implement: refused when truthy (flag -> why)
    unsupported_flags: dict[str, str] = {}
    # Mixture of experts: config.json fields of the expert count and of the experts each token uses
    # (0 experts = a dense MLP); the planner counts total vs active parameters from them
    moe_experts_field: str | None = None
    moe_active_field: str | None = None
    # quantization_config.quant_method values a checkpoint of this family ships in and TensorRT-LLM
    # loads as shipped (``--quant native``); ModelOpt re-quantization of such a target is refused
    native_quant_methods: tuple[str, ...] = ()
    # why ModelOpt fp8/nvfp4 of this family is refused (None: allowed)
    modelopt_refused: str | None = None
    # learned per-head attention-sink logits (one fp32 scalar per query head per layer)
    attention_sinks: bool = False
    # how TensorRT-LLM's model of this family decides the rotary dim (rope_params.rotary_dim_of):
    # "rope_params" RopeParams.from_config's keys (Llama), "partial_rotary_factor" only (Qwen3's fused
    # QK-norm+RoPE kernel), "head_dim" always the whole head (gpt-oss)
    rotary_dim_rule: Literal["rope_params", "partial_rotary_factor", "head_dim"] = "rope_params"
    # the attention also parses rope_scaling's type as a PositionEmbeddingType (type key first on presence)
    position_type_from_scaling: bool = False
    # transformers attention the reference runtime must use (None: the runtime's GQA SDPA); a family whose
    # attention SDPA cannot express (gpt-oss's sinks) names transformers' own implementation
    attn_implementation: str | None = None
    # TensorRT-LLM KV-cache settings the family's deployment guide uses (planner constants)
    kv_free_gpu_memory_fraction: float = 0.9  # TensorRT-LLM's KvCacheConfig default
    kv_block_reuse: bool = True  # TensorRT-LLM's KvCacheConfig default
    # MoE expert parallelism for a TP size (moe_expert_parallel_size; the rest of tp is moe_tp_size)
    moe_ep_for_tp: dict[int, int] = {}
    # moe_config.backend by GPU generation (none: TensorRT-LLM's default, "AUTO")
    moe_backend: dict[str, str] = {}
    trtllm_source: str = Field(description="the TensorRT-LLM model file this entry was checked against")

    def default_aux_layers(self, num_layers: int) -> tuple[int, ...]:
        return AUX_RULES[self.aux_rule](num_layers)

    def head_dim(self, cfg: dict[str, Any]) -> int:
        """head_dim of a config dict as transformers' config class of this family reads it."""
        if cfg.get("head_dim"):
            return int(cfg["head_dim"])
        if self.default_head_dim is not None:
            return self.default_head_dim
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])

    def expected_layer_tensors(self, quant_method: str | None = None) -> dict[str, Shape]:
        """The tensors of one decoder layer a checkpoint of this family has: the dense table, with the
        entries a natively quantized format replaces swapped for what it ships."""
        out: dict[str, Shape] = {}
        swaps = self.native_layer_tensors.get(quant_method or "", {})
        for name, shape in self.layer_tensors.items():
            out.update(swaps.get(name, {name: shape}))
        return out

    def norm_params_per_layer(self, hidden: int, head_dim: int) -> int:
        """RMSNorm weights of one decoder layer: input and post-attention norms (+ q/k norms)."""
        return 2 * hidden + (2 * head_dim if self.qk_norm else 0)


LLAMA = Family(
    name="llama",
    # Mistral (dense, no sliding window in use) is served by TensorRT-LLM's Llama path and computed
    # here by LlamaForCausalLM, as before this table existed.
    model_types=("llama", "mistral"),
    architectures=("LlamaForCausalLM", "MistralForCausalLM"),
    hf_class="LlamaForCausalLM",
    hf_config_class="LlamaConfig",
    trtllm_source="tensorrt_llm/_torch/models/modeling_llama.py",
)

QWEN3 = Family(
    name="qwen3",
    model_types=("qwen3",),
    architectures=("Qwen3ForCausalLM",),
    hf_class="Qwen3ForCausalLM",
    hf_config_class="Qwen3Config",
    # QKNormRoPEAttention: RMSNorm over each head of q and k, then rope (modeling_qwen3.py @ 010bb95f)
    qk_norm=True,
    default_head_dim=128,
    # apply_qk_norm_rope: rotary_dim = int(head_dim * partial_rotary_factor) (qk_norm_attention.py @
    # 034c3f0a0d1d5d90e5567c8d953019bdf5243b77), fuse_qk_norm_rope being Qwen3Attention's default
    rotary_dim_rule="partial_rotary_factor",
    # Qwen3Attention: PositionEmbeddingType.from_string(rope_scaling["type"] if "type" in it else ["rope_type"])
    # (modeling_qwen3.py, newest text: search-index id 46245023650, commit unknown)
    position_type_from_scaling=True,
    layer_tensors={**ATTENTION, **QK_NORM, **DENSE_MLP, **NORMS},
    unsupported_flags={
        "use_sliding_window": "TensorRT-LLM's Qwen3 attention has no sliding window (QKNormRoPEAttention "
        "in modeling_qwen3.py @ 010bb95f), while transformers would apply one"
    },
    # q_norm/k_norm are RMSNorm modules, not Linear: ModelOpt puts no quantizer on them, so they stay
    # BF16 (checked on an FP8 and an NVFP4 export of a Qwen3 target, ModelOpt 0.37 and 0.47)
    trtllm_source="tensorrt_llm/_torch/models/modeling_qwen3.py @ 010bb95fbad3c678792a9edf659970299a1a320b",
)

GPT_OSS = Family(
    name="gpt-oss",
    model_types=("gpt_oss",),
    architectures=("GptOssForCausalLM",),
    hf_class="GptOssForCausalLM",
    hf_config_class="GptOssConfig",
    # TransformerBlock.forward_normal/forward_tp call spec_metadata.maybe_capture_hidden_states(
    # self.layer_idx, x, residual) after the MoE block, as Llama does, and the file sets no capture
    # default of its own: the generic {1, L//2-1, L-4} applies ([1, 17, 32] for 120b, [1, 11, 20] for
    # 20b). AttentionBlock: sliding_window only on even layers (layer_idx % 2 == 0), sinks of
    # num_attention_heads // tp fp32 values per layer, q/k/v/o with bias; MLPBlock: router Linear
    # with bias + create_moe over num_local_experts with top-k num_experts_per_tok, biased experts;
    # pipeline parallelism asserted off (modeling_gpt_oss.py @ 050b6cb92871a4ed73486c5e5a573d4198d1a6d9)
    default_head_dim=64,  # transformers' GptOssConfig default (hidden 2880 is not 64 heads x 64)
    # AttentionBlock builds RopeParams(dim=head_dim, ...) by hand (modeling_gpt_oss.py @ 7924c7f1d3b4a3286b62c13fc890900295dc39cb)
    rotary_dim_rule="head_dim",
    layer_tensors={**ATTENTION, **ATTENTION_BIAS, **GPT_OSS_MOE, **NORMS},
    native_layer_tensors={"mxfp4": GPT_OSS_MXFP4},
    moe_experts_field="num_local_experts",
    moe_active_field="num_experts_per_tok",
    # openai/gpt-oss-{20b,120b} ship MoE experts in MXFP4 (quantization_config.quant_method "mxfp4",
    # attention, router, embedding and lm_head in BF16: modules_to_not_convert); TensorRT-LLM loads the
    # *_blocks/*_scales tensors directly (GptOssForCausalLM.load_hf_weights, same file and commit)
    native_quant_methods=("mxfp4",),
    # ModelOpt's fp8/nvfp4 export of the fused experts carries per-expert-tensor input scales the reference
    # runtime does not apply (GptOssExperts has no Linear to hook), so the measured alpha would not be the
    # served one; the shipped MXFP4 checkpoint (--quant native) or BF16 is what this toolkit builds
    modelopt_refused=("ModelOpt's fp8/nvfp4 export of gpt-oss's fused experts is not measured faithfully by the reference runtime (per-expert input scales)"),
    attention_sinks=True,
    # transformers refuses SDPA for GptOss (sinks join the softmax); its eager attention adds them
    # (GptOssAttention / eager_attention_forward, transformers 5.x and 4.57)
    attn_implementation="eager",
    # TensorRT-LLM's "Running GPT-OSS-120B with Eagle3 Speculative Decoding on GB200/B200" guide
    # (docs/source/blogs/tech_blog/blog11_GPT_OSS_Eagle3.md @ 2772a81b730f15d1bd0f8fe2163e3e50c98d99c7):
    # kv_cache_config {enable_block_reuse: false, free_gpu_memory_fraction: 0.8}, Eagle max_draft_len 3,
    # trtllm-serve --tp_size 8 --ep_size 4 (8 GPUs); other TP sizes: EP = TP up to 4 (an assumption:
    # the expert bytes per GPU are the same for any split of TP into moe_tp x moe_ep)
    kv_free_gpu_memory_fraction=0.8,
    kv_block_reuse=False,
    moe_ep_for_tp={1: 1, 2: 2, 4: 4, 8: 4, 16: 4},
    # MoE kernels: the EAGLE-3 guide (blog11 @ 2772a81b) sets ``moe_config: {backend: TRTLLM}`` on B200/GB200;
    # on Hopper TensorRT-LLM's gpt-oss README (examples/models/core/gpt_oss/README.md @ 0ee4114c) says to use
    # TRITON "for both latency and throughput cases". Both are also what "AUTO" resolves to for
    # GptOssForCausalLM (SM100-119 -> TRTLLM, SM90-99 -> TRITON: tensorrt_llm/_torch/model_config.py @
    # 008e0af8), but releases whose default was still CUTLASS (llm_args.py MoeConfig) need it written.
    moe_backend={"hopper": "TRITON", "blackwell": "TRTLLM"},
    trtllm_source="tensorrt_llm/_torch/models/modeling_gpt_oss.py @ 050b6cb92871a4ed73486c5e5a573d4198d1a6d9",
)

FAMILIES: tuple[Family, ...] = (LLAMA, QWEN3, GPT_OSS)


def family_named(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def known_families() -> str:
    return ", ".join(f"{f.name} (model_type {'/'.join(f.model_types)})" for f in FAMILIES)


def family_of(model_type: str | None, where: str = "config.json:model_type") -> Family:
    """The family of a config.json's ``model_type``; an unknown one is refused by name."""
    for f in FAMILIES:
        if model_type in f.model_types:
            return f
    raise UserError(where, f"{model_type!r} is not a target family eagle3-trt knows", f"known families: {known_families()}")


def family_of_config(cfg: dict[str, Any], where: str = "config.json") -> Family:
    return family_of(cfg.get("model_type"), f"{where}:model_type")


def quant_refusal(fam: Family, method: str | None, quant: str | None) -> tuple[str, str] | None:
    """Why a target of ``fam`` shipped in ``method`` (a quant_method; None: unquantized) cannot be built with
    ``quant`` (None: not chosen yet, as plain ``validate``), as (what, hint); None when it can. The one
    policy the planner (engine, plan, dry runs) and validate both apply:
    - a target shipped in a format its family is served in as is (gpt-oss MXFP4) is kept as shipped
      (``native``); re-quantizing it would compound two roundings, and a BF16 copy only costs memory;
    - any other shipped quantization is refused (ModelOpt would quantize dequantized weights);
    - ``native`` needs such a shipped format; a family may refuse ModelOpt's formats altogether."""
    shipped = f" or the {fam.name} checkpoint as shipped ({', '.join(fam.native_quant_methods)}) with --quant native" if fam.native_quant_methods else ""
    native = method in fam.native_quant_methods
    if method is not None and quant != "native":
        if native and quant is None:
            return None
        if native and quant == "bf16":
            return (
                f"bf16 on a target that ships {method.upper()} experts: eagle3-trt keeps them as shipped (TensorRT-LLM loads "
                "them directly; a BF16 copy would hold the same weights in 3.8x the memory)",
                "use --quant native (Hopper or Blackwell)",
            )
        if native:
            return (
                f"{quant} on a target that ships {method.upper()} weights (quantization_config.quant_method {method!r}): "
                "re-quantizing would compound two roundings",
                "use --quant native to keep its weights as shipped",
            )
        return (f"target is already quantized ({method!r}), a format eagle3-trt does not keep as shipped", f"pass the BF16/FP16 checkpoint{shipped}")
    if quant == "native" and not native:
        if method is None:
            return (
                "native keeps an already-quantized target as shipped, but this target is not quantized",
                "use --quant bf16" + ("" if fam.modelopt_refused else ", fp8 or nvfp4"),
            )
        return (
            f"native keeps an already-quantized target as shipped, but this target is in {method!r}, which TensorRT-LLM's "
            f"{fam.name} model does not load as shipped",
            f"pass the BF16/FP16 checkpoint{shipped}",
        )
    if fam.modelopt_refused and quant in ("fp8", "nvfp4"):
        return f"{quant} on a {fam.name} target: {fam.modelopt_refused}", f"use --quant bf16{shipped}"
    return None


def default_aux_layers_of(cfg: dict[str, Any], where: str = "config.json") -> tuple[int, ...]:
    """The default aux layers of a target config dict (its family's rule over its layer count)."""
    return family_of_config(cfg, where).default_aux_layers(int(cfg["num_hidden_layers"]))
