"""Config-only deployment planner: memory, parallelism and serving limits from config.json alone.

Everything here is arithmetic on Hugging Face config fields, so a plan can be made on any
machine, without weights, torch or TensorRT-LLM. Figures are per GPU unless named otherwise;
bytes are exact integers and printed as decimal GB (1e9), except per-token KV sizes, which are
printed in KiB. GPU memory is the total nvidia-smi reports (``GpuSpec.memory_mib``), not the
marketing figure: an "80 GB" H100 has 81559 MiB = 85.52 GB.

Sharding model (TensorRT-LLM PyTorch backend, tensor parallelism ``tp``):
- every attention and MLP Linear is split ``tp`` ways (q/k/v/gate/up by column, o/down by row);
- the embedding and lm_head are split ``tp`` ways as well (vocab-parallel);
- RMSNorm weights are replicated;
- the KV cache holds ``num_key_value_heads / tp`` heads per GPU;
- pipeline parallelism ``pp`` gives each stage ``ceil(layers / pp)`` layers; the first stage
  holds the embedding and the last the lm_head, so the worst stage holds one of them.
The EAGLE-3 draft head is counted in BF16 and replicated on every GPU (an upper bound; see
``_draft_weight_bytes``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from eagle3_trt.convert.families import EAGLE3_DEFAULT_NUM_AUX, LLAMA, family_named, family_of_config, quant_refusal
from eagle3_trt.convert.hf_config import LlamaConfigFields, parse_config
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.gpus import GpuSpec, check_quant_for_gpu, get_gpu
from eagle3_trt.pipeline.presets import Preset, load_preset, resolve_source
from eagle3_trt.resources import data_dir

KvDtype = Literal["fp8", "bf16"]

MODEL_CONFIG_DIR = data_dir("build") / "model_configs"

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

# TensorRT-LLM KvCacheConfig defaults: free_gpu_memory_fraction 0.9, tokens_per_block 32
# [NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py].
FREE_GPU_MEMORY_FRACTION = 0.9
TOKENS_PER_BLOCK = 32
# TensorRT-LLM's default max_num_tokens is 8192 [llm_args.py]; prompts longer than this need chunked prefill.
DEFAULT_MAX_NUM_TOKENS = 8192
# TensorRT-LLM's CUDA-graph max batch size when neither batch_sizes nor max_batch_size is set
# [llm_args.py CudaGraphConfig]; also our cap on max_batch_size,
# since EAGLE-3 gains shrink at large batches and the bundle switches speculation off above
# max_concurrency anyway.
MAX_BATCH_CAP = 128
# A TP layout "fits" only if it holds at least this many sequences of max_seq_len tokens at
# once: one full-length sequence would make the KV budget the bottleneck for any real traffic.
MIN_FULL_SEQUENCES = 4
# One-model EAGLE-3 captures three target layers by default (convert/families.py)
EAGLE3_CAPTURED_LAYERS = EAGLE3_DEFAULT_NUM_AUX

# Reserve outside weights and KV cache, per GPU. These are estimates, chosen on the high side
# because a plan that overestimates free memory fails at load time on the user's box.
# CUDA context, cuBLAS/cuBLASLt workspaces and PyTorch allocator slack: ~0.5-0.8 GB measured on
# Hopper for a bare torch process; 1 GB leaves room for TensorRT-LLM's own buffers.
RUNTIME_BYTES = 1_000_000_000
# NCCL channel buffers plus TensorRT-LLM's custom all-reduce workspace, only when tp*pp > 1.
NCCL_BYTES = 500_000_000
# Each captured decode CUDA graph holds up to ~200 MB [cuda_graph_config in llm_args.py]; graphs are
# captured after the KV cache is sized, so they must come out of the 10% left over or from here.
CUDA_GRAPH_BYTES = 200_000_000

GB = 1e9
KIB = 1024


# ---------------------------------------------------------------------------------------------
# Config parsing


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


# ---------------------------------------------------------------------------------------------
# Parameter counts


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


# ---------------------------------------------------------------------------------------------
# Bytes


def target_weight_bytes(p: TargetParams, quant: str, tp: int = 1, pp: int = 1) -> int:
    """Target weight bytes on the most loaded GPU (all GPUs together at tp=pp=1)."""
    layers = math.ceil(p.layers / pp)
    if p.bf16_per_layer or p.expert_weights_per_layer or quant == "native":
        # "native": the experts stay in the checkpoint's format, everything else as shipped (BF16);
        # a format ModelOpt writes covers attention and experts; biases, router and sinks stay BF16.
        # Experts are split over TP x EP = tp GPUs (moe_tp_size * moe_ep_size = tp_size in TensorRT-LLM's
        # Mapping), so an expert's bytes per GPU do not depend on how tp is split between the two.
        if quant == "native" and p.native_format is None:
            raise UserError(
                "--quant", "native keeps an already-quantized target as shipped, but this target is not quantized", "use --quant bf16, fp8 or nvfp4"
            )
        expert_b = LINEAR_BYTES[p.native_format if quant == "native" else quant]  # type: ignore[index]
        other_b = BF16_BYTES if quant == "native" else LINEAR_BYTES[quant]
        quantizable = p.attn_per_layer + p.mlp_per_layer - p.bf16_per_layer
        per_layer = p.expert_weights_per_layer * expert_b + (quantizable - p.expert_weights_per_layer) * other_b + p.bf16_per_layer * BF16_BYTES
        linear = layers * per_layer / tp
    else:
        linear = layers * (p.attn_per_layer + p.mlp_per_layer) * LINEAR_BYTES[quant] / tp
    # With pp > 1 the embedding and lm_head sit on different stages; the worst holds one.
    vocab_params = p.embed + p.lm_head if pp == 1 else max(p.embed, p.lm_head)
    vocab = vocab_params * BF16_BYTES / tp
    norms = (layers * p.norms_per_layer + p.final_norm) * BF16_BYTES
    return int(round(linear + vocab + norms))


def _draft_weight_bytes(d: DraftParams | None) -> int:
    # Counted replicated and unsharded. TensorRT-LLM builds the draft with the target's mapping,
    # so its attention and lm_head are probably TP-sharded too (UNVERIFIED); replication is the
    # safe bound and costs at most (1 - 1/tp) * 2.8 GB of KV budget at 70B.
    if d is None:
        return 0
    return d.total * BF16_BYTES + d.d2t * 4


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, kv_dtype: str, tp: int) -> int:
    """K and V for one token on one GPU."""
    return 2 * layers * (kv_heads // tp) * head_dim * KV_BYTES[kv_dtype]


@dataclass(frozen=True)
class Reserve:
    """Per-GPU memory held outside weights and KV cache, with each part shown."""

    runtime: int
    nccl: int
    activations: int  # largest per-layer transient for a max_num_tokens forward
    eagle3_hidden: int  # one-model EAGLE-3 buffer of captured hidden states
    logits: int
    cuda_graphs: int
    total: int


def _activation_bytes(s: LlamaShape, tp: int, max_num_tokens: int) -> int:
    # Everything one decoder layer can hold at once, summed as if all alive together (they are
    # not, which is the safety margin): residual and normed hidden (full H after all-reduce),
    # fused qkv output, attention output, fused gate/up output and the activated product.
    q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
    # a MoE layer holds each token's gate/up/down activations once per expert it is routed to
    per_token = 2 * s.hidden + (q_out + 2 * kv_out) // tp + q_out // tp + 3 * s.intermediate * max(1, s.active_experts) // tp
    return per_token * BF16_BYTES * max_num_tokens


def _reserve(
    s: LlamaShape,
    draft: DraftParams | None,
    tp: int,
    pp: int,
    max_num_tokens: int,
    max_batch_size: int,
    max_draft_len: int,
    n_graphs: int,
) -> Reserve:
    runtime = RUNTIME_BYTES
    nccl = NCCL_BYTES if tp * pp > 1 else 0
    act = _activation_bytes(s, tp, max_num_tokens)
    # Eagle3ResourceManager keeps [max_num_tokens, captured_layers * H] in BF16 for the draft.
    hidden = max_num_tokens * EAGLE3_CAPTURED_LAYERS * s.hidden * BF16_BYTES if draft else 0
    # Generation steps verify K+1 tokens per sequence; logits are FP32 and gathered to the full
    # vocabulary on every rank. The draft adds one step of its smaller vocabulary at a time.
    rows = max_batch_size * (max_draft_len + 1)
    logits = rows * s.vocab * 4 + (max_batch_size * draft.draft_vocab * 4 if draft else 0)
    graphs = n_graphs * CUDA_GRAPH_BYTES
    total = runtime + nccl + act + hidden + logits + graphs
    return Reserve(runtime, nccl, act, hidden, logits, graphs, total)


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class Plan:
    model: str
    gpu: str
    gpu_memory_bytes: int
    num_gpus: int
    tp: int
    pp: int
    instances: int  # independent TP groups (Triton instances) on num_gpus
    gpu_device_ids: str  # Triton's "0,1;2,3" form, one group per instance
    quant: str
    kv_cache_dtype: str
    max_seq_len: int
    max_draft_len: int  # 0 when not speculating
    speculative: bool
    target: TargetParams
    draft: DraftParams | None
    target_weight_bytes_per_gpu: int
    draft_weight_bytes_per_gpu: int
    kv_bytes_per_token_target: int  # per GPU
    kv_bytes_per_token_draft: int  # per GPU
    reserve: Reserve
    free_gpu_memory_fraction: float
    kv_cache_bytes_per_gpu: int
    kv_tokens: int  # per TP group (every rank holds the same tokens)
    sequences_at_max_seq_len: int
    max_batch_size: int
    max_num_tokens: int
    enable_chunked_prefill: bool
    cuda_graph_batch_sizes: tuple[int, ...]
    cuda_graph_padding: bool
    target_checkpoint_bytes: int  # the BF16 source checkpoint, all shards
    quantized_target_bytes: int  # exported target, all shards (unsharded total)
    notes: tuple[str, ...]
    # MoE layout (0 for a dense target): moe_ep_size x moe_tp_size = tp, experts held per GPU
    moe_ep: int = 0
    moe_tp: int = 0
    experts_per_gpu: int = 0
    expert_bytes_per_gpu: int = 0  # inside target_weight_bytes_per_gpu
    kv_block_reuse: bool = True
    moe_backend: str | None = None  # moe_config.backend (the family's table by GPU generation; None: TensorRT-LLM's default)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes_per_token_target + self.kv_bytes_per_token_draft

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kv_bytes_per_token"] = self.kv_bytes_per_token
        d["cuda_graph_batch_sizes"] = list(self.cuda_graph_batch_sizes)
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True)
class _Budget:
    weights: int
    draft: int
    kv_target: int
    kv_draft: int
    reserve: Reserve
    kv_cache: int
    kv_tokens: int
    sequences: int


def _budget(
    gpu: GpuSpec,
    s: LlamaShape,
    p: TargetParams,
    draft: DraftParams | None,
    quant: str,
    kv_dtype: str,
    tp: int,
    pp: int,
    max_seq_len: int,
    max_draft_len: int,
    max_num_tokens: int,
    max_batch_size: int,
    free_fraction: float = FREE_GPU_MEMORY_FRACTION,
) -> _Budget:
    weights = target_weight_bytes(p, quant, tp, pp)
    draft_bytes = _draft_weight_bytes(draft)
    # Sliding-window layers (gpt-oss) cost as much KV as full ones: with no kv_cache_config.max_attention_window
    # (our options and TensorRT-LLM's gpt-oss guide set none) the KV cache manager gives every layer
    # max_seq_len (KVCacheManager: ``max_attention_window_vec = [max_seq_len]``, tensorrt_llm/_torch/pyexecutor/
    # resource_manager.py @ 001541ba); the window is applied only inside attention (modeling_gpt_oss.py @
    # 050b6cb9, attention_window_size). Setting max_attention_window would not hold more full-length
    # sequences either: the VSWA pools split the memory equally per window size (calculate_max_num_blocks_for_vswa,
    # same file), so the full-attention half bounds the sequences exactly as here.
    kv_t = kv_bytes_per_token(math.ceil(s.layers / pp), s.kv_heads, s.head_dim, kv_dtype, tp)
    # The draft's layer lives in the same KV pool and takes the target's KV format: its kv_cache_quant_algo
    # is overwritten with the target's [SpecDecOneEngineForCausalLM.__init__, NVIDIA/TensorRT-LLM
    # tensorrt_llm/_torch/models/modeling_speculative.py].
    kv_d = kv_bytes_per_token(draft.layers, draft.kv_heads, draft.head_dim, kv_dtype, tp) if draft else 0
    reserve = _reserve(s, draft, tp, pp, max_num_tokens, max_batch_size, max_draft_len, len(graph_batch_sizes(max_batch_size)))
    free = gpu.memory_bytes - weights - draft_bytes - reserve.total
    kv_cache = max(0, int(free * free_fraction))
    block = (kv_t + kv_d) * TOKENS_PER_BLOCK
    blocks = kv_cache // block
    # Each sequence also holds its K draft tokens' KV while they are verified.
    blocks_per_seq = math.ceil((max_seq_len + max_draft_len) / TOKENS_PER_BLOCK)
    return _Budget(weights, draft_bytes, kv_t, kv_d, reserve, kv_cache, blocks * TOKENS_PER_BLOCK, blocks // blocks_per_seq)


def graph_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to max_batch_size, plus max_batch_size itself; padding covers the gaps."""
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size]
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return tuple(sizes)


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def _check_inputs(
    s: LlamaShape,
    gpu: GpuSpec,
    num_gpus: int,
    quant: str,
    kv_dtype: str,
    max_seq_len: int,
    max_draft_len: int,
    tp: int | None,
    pp: int,
    speculative: bool,
    max_batch_size: int | None,
) -> None:
    check_quant_for_gpu(quant, gpu)
    check_quant_for_target(s, quant)
    if kv_dtype not in KV_BYTES:
        raise UserError("--kv-cache-dtype", f"unknown KV cache format {kv_dtype!r}", "choose fp8 or bf16")
    if num_gpus < 1:
        raise UserError("--gpus", f"need at least one GPU, got {num_gpus}", "pass --gpus 1 or more")
    if max_seq_len < 1 or max_draft_len < 0:
        raise UserError("--max-seq-len", f"max_seq_len {max_seq_len} / max_draft_len {max_draft_len} out of range", "max_seq_len >= 1 and max_draft_len >= 0")
    if s.max_positions and max_seq_len > s.max_positions:
        raise UserError(
            "--max-seq-len",
            f"{max_seq_len} exceeds the target's max_position_embeddings ({s.max_positions})",
            f"use --max-seq-len {s.max_positions} or less",
        )
    if max_batch_size is not None and max_batch_size < 1:
        raise UserError("--max-batch-size", f"must be at least 1, got {max_batch_size}", "omit it to let the planner choose")
    if pp < 1:
        raise UserError("--pp", f"pipeline parallel size must be at least 1, got {pp}", "use --pp 1")
    if pp > num_gpus:
        raise UserError("--pp", f"pp={pp} needs at least {pp} GPUs but only {num_gpus} given", f"use --gpus {pp} or a smaller --pp")
    if pp > 1 and speculative:
        raise UserError(
            "--pp",
            f"pipeline parallelism (pp={pp}) cannot be combined with EAGLE-3 speculative decoding: TensorRT-LLM does not support it",
            "use tensor parallelism instead (--tp N, --pp 1)",
        )
    if tp is not None:
        _check_tp(s, tp, pp, num_gpus)


def moe_cost_inputs(s: LlamaShape, expert_format: str) -> dict | None:
    """What the cost model needs of a MoE target (runtime/cost_model.py ``model_cost(moe=...)``): its experts,
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


def check_quant_for_target(s: LlamaShape, quant: str, where: str = "--quant") -> None:
    """The target's shipped format against ``quant`` (convert/families.py ``quant_refusal``: the one policy)."""
    refused = quant_refusal(family_named(s.family), s.quant_method, quant)
    if refused:
        raise UserError(where, *refused)


def _check_tp(s: LlamaShape, tp: int, pp: int, num_gpus: int) -> None:
    if tp < 1:
        raise UserError("--tp", f"tensor parallel size must be at least 1, got {tp}", "use a power of two such as 1, 2, 4 or 8")
    if tp * pp > num_gpus:
        raise UserError("--tp", f"tp={tp} x pp={pp} needs {tp * pp} GPUs but only {num_gpus} given", f"use --gpus {tp * pp} or a smaller --tp")
    for field, heads in (("num_key_value_heads", s.kv_heads), ("num_attention_heads", s.heads)):
        if heads % tp:
            ok = [t for t in (1, 2, 4, 8, 16) if s.kv_heads % t == 0 and s.heads % t == 0 and t <= num_gpus]
            raise UserError("--tp", f"tp={tp} does not divide {field} ({heads})", f"use --tp {' or '.join(map(str, ok))}")


def _tp_candidates(s: LlamaShape, limit: int) -> list[int]:
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= limit and s.kv_heads % t == 0 and s.heads % t == 0]


def make_plan(
    target_cfg: dict[str, Any],
    draft_cfg: dict[str, Any] | None,
    gpu: GpuSpec,
    num_gpus: int,
    quant: str,
    max_seq_len: int,
    kv_cache_dtype: KvDtype,
    max_draft_len: int,
    tp: int | None = None,
    pp: int = 1,
    max_batch_size: int | None = None,
    *,
    model: str = "model",
) -> Plan:
    """Plan one deployment, or raise UserError saying why it cannot work.

    TP rule: unless ``tp`` is given, take the smallest power of two t <= num_gpus / pp (and
    dividing both head counts) whose per-GPU KV budget holds at least MIN_FULL_SEQUENCES
    sequences of max_seq_len tokens. Smallest TP means the least all-reduce traffic and the
    most independent instances per node (num_gpus // (t * pp)); pass ``tp`` for lower latency
    per request at the cost of throughput.
    """
    s = parse_shape(target_cfg, "target config.json")
    draft = count_draft(draft_cfg, s) if draft_cfg is not None and max_draft_len > 0 else None
    speculative = draft is not None
    k = max_draft_len if speculative else 0
    _check_inputs(s, gpu, num_gpus, quant, kv_cache_dtype, max_seq_len, max_draft_len, tp, pp, speculative, max_batch_size)
    p = count_target(s)

    fam = family_named(s.family)

    def budget(t: int, mbs: int) -> _Budget:
        mnt = max(DEFAULT_MAX_NUM_TOKENS, mbs * (k + 1))
        return _budget(gpu, s, p, draft, quant, kv_cache_dtype, t, pp, max_seq_len, k, mnt, mbs, fam.kv_free_gpu_memory_fraction)

    # Pass 1 sizes the reserve for the largest batch we would allow, so a layout that passes
    # here still fits once the batch size (and with it the CUDA-graph count) is settled.
    cap = max_batch_size or MAX_BATCH_CAP
    candidates = [tp] if tp is not None else _tp_candidates(s, num_gpus // pp)
    tried = [(t, budget(t, cap)) for t in candidates]
    chosen = next(((t, b) for t, b in tried if b.sequences >= MIN_FULL_SEQUENCES), None)
    if chosen is None:
        raise _does_not_fit(model, s, p, draft, gpu, num_gpus, quant, kv_cache_dtype, max_seq_len, k, pp, tried, tp)
    t, first = chosen

    mbs = max_batch_size or min(MAX_BATCH_CAP, _pow2_floor(first.sequences))
    final = budget(t, mbs)  # reserve only shrinks from pass 1, so the KV budget only grows
    max_num_tokens = max(DEFAULT_MAX_NUM_TOKENS, mbs * (k + 1))
    instances = num_gpus // (t * pp)
    ep = moe_ep_size(s, t)
    expert_bytes = 0
    if s.experts:
        eb = LINEAR_BYTES[p.native_format if quant == "native" else quant]  # type: ignore[index]
        # each GPU holds experts/ep experts, each split moe_tp = tp/ep ways
        expert_bytes = int(round(math.ceil(s.layers / pp) * (s.experts // ep) * (p.expert_weights_per_layer // s.experts) * eb / (t // ep)))
    return Plan(
        model=model,
        gpu=gpu.name,
        gpu_memory_bytes=gpu.memory_bytes,
        num_gpus=num_gpus,
        tp=t,
        pp=pp,
        instances=instances,
        gpu_device_ids=_device_ids(instances, t * pp),
        quant=quant,
        kv_cache_dtype=kv_cache_dtype,
        max_seq_len=max_seq_len,
        max_draft_len=k,
        speculative=speculative,
        target=p,
        draft=draft,
        target_weight_bytes_per_gpu=final.weights,
        draft_weight_bytes_per_gpu=final.draft,
        kv_bytes_per_token_target=final.kv_target,
        kv_bytes_per_token_draft=final.kv_draft,
        reserve=final.reserve,
        free_gpu_memory_fraction=fam.kv_free_gpu_memory_fraction,
        kv_cache_bytes_per_gpu=final.kv_cache,
        kv_tokens=final.kv_tokens,
        sequences_at_max_seq_len=final.sequences,
        max_batch_size=mbs,
        max_num_tokens=max_num_tokens,
        enable_chunked_prefill=max_seq_len > max_num_tokens,
        cuda_graph_batch_sizes=graph_batch_sizes(mbs),
        cuda_graph_padding=True,
        # a natively quantized target (gpt-oss MXFP4) is read as shipped, not as BF16
        target_checkpoint_bytes=target_weight_bytes(p, "native") if p.native_format else p.total * BF16_BYTES,
        quantized_target_bytes=target_weight_bytes(p, quant),
        notes=tuple(_notes(s, draft, gpu, num_gpus, t, pp, instances, max_seq_len, tp is None, quant, kv_cache_dtype, p)),
        moe_ep=ep,
        moe_tp=t // ep if ep else 0,
        experts_per_gpu=s.experts // ep if ep else 0,
        expert_bytes_per_gpu=expert_bytes,
        kv_block_reuse=fam.kv_block_reuse,
        moe_backend=fam.moe_backend.get(gpu.generation) if s.experts else None,
    )


def moe_ep_size(s: LlamaShape, tp: int) -> int:
    """moe_expert_parallel_size for a MoE target at ``tp`` (its family's table; 0 for a dense target)."""
    if not s.experts:
        return 0
    ep = family_named(s.family).moe_ep_for_tp.get(tp, tp)
    while ep > 1 and (s.experts % ep or tp % ep):
        ep //= 2
    return ep


def _device_ids(instances: int, per_instance: int) -> str:
    groups = (range(i * per_instance, (i + 1) * per_instance) for i in range(instances))
    return ";".join(",".join(map(str, g)) for g in groups)


def _does_not_fit(
    model: str,
    s: LlamaShape,
    p: TargetParams,
    draft: DraftParams | None,
    gpu: GpuSpec,
    num_gpus: int,
    quant: str,
    kv_dtype: str,
    max_seq_len: int,
    k: int,
    pp: int,
    tried: list[tuple[int, _Budget]],
    tp: int | None,
) -> UserError:
    t, b = tried[-1] if tried else (1, None)
    if b is None:
        return UserError("--gpus", f"no tensor-parallel size <= {num_gpus} divides the model's heads ({s.heads}/{s.kv_heads})", "use more GPUs")
    need = (
        f"at TP{t} each GPU needs {b.weights / GB:.1f} GB weights + {b.draft / GB:.1f} GB draft + {b.reserve.total / GB:.1f} GB reserve "
        f"and has {gpu.memory_gb:.2f} GB, leaving KV room for {b.sequences} sequence(s) of {max_seq_len} tokens (need {MIN_FULL_SEQUENCES})"
    )
    what = f"{model} at {quant} does not fit on {num_gpus}x {gpu.name}: {need}"
    hint = _fit_hint(s, p, draft, gpu, num_gpus, quant, kv_dtype, max_seq_len, k, pp, kv_room=b.kv_cache > 0)
    return UserError("--gpus" if tp is None else "--tp", what, hint)


def _fit_hint(
    s: LlamaShape,
    p: TargetParams,
    draft: DraftParams | None,
    gpu: GpuSpec,
    num_gpus: int,
    quant: str,
    kv_dtype: str,
    max_seq_len: int,
    k: int,
    pp: int,
    kv_room: bool,
) -> str:
    """Name the smallest TP that would fit, and a smaller format, if any."""
    hints = []
    for t in _tp_candidates(s, 64):
        if _budget(gpu, s, p, draft, quant, kv_dtype, t, pp, max_seq_len, k, DEFAULT_MAX_NUM_TOKENS, MAX_BATCH_CAP).sequences >= MIN_FULL_SEQUENCES:
            hints.append(f"use --tp {t}" if t * pp <= num_gpus else f"use --gpus {t * pp} (TP{t})")
            break
    smaller = {"bf16": "fp8", "fp8": "nvfp4"}.get(quant)
    if smaller and gpu.sm >= {"fp8": 89, "nvfp4": 100}[smaller]:
        hints.append(f"or --quant {smaller}")
    if kv_room:  # a shorter context only helps when the weights already fit
        hints.append("or a shorter --max-seq-len")
    return " ".join(hints) or "use a GPU with more memory"


def _notes(
    s: LlamaShape,
    draft: DraftParams | None,
    gpu: GpuSpec,
    num_gpus: int,
    tp: int,
    pp: int,
    instances: int,
    max_seq_len: int,
    tp_chosen: bool,
    quant: str,
    kv_dtype: str,
    p: TargetParams | None = None,
) -> list[str]:
    notes = []
    if s.experts and p is not None:
        notes.append(
            f"MoE: {s.experts} experts per layer, {s.active_experts} per token: {_bparams(p.active)} active params per token "
            f"(without the embedding table) of {_bparams(p.total)}"
        )
    if quant == "native" and p is not None:
        notes.append(f"--quant native: experts kept in the shipped {p.native_format} format, attention/router/embedding/lm_head BF16 as shipped")
    if s.window_layers:
        notes.append(
            f"{s.window_layers} of {s.layers} layers use a {s.sliding_window}-token sliding window; TensorRT-LLM still gives "
            f"them KV for {max_seq_len} tokens (no max_attention_window is set; VSWA's equal pool split would hold "
            "no more full-length sequences), so the plan counts every layer in full"
        )
    if quant == "bf16" and kv_dtype == "fp8":
        notes.append("FP8 KV cache with BF16 weights: no calibration step, so KV scales are 1.0 (fp8_cast)")
    if tp_chosen:
        notes.append(
            f"TP{tp} is the smallest power of two that leaves KV room for >= {MIN_FULL_SEQUENCES} sequences "
            f"of {max_seq_len} tokens; pass --tp for lower per-request latency"
        )
    if instances * tp * pp < num_gpus:
        notes.append(f"{num_gpus - instances * tp * pp} GPU(s) left idle: {num_gpus} is not a multiple of tp*pp={tp * pp}")
    if draft and draft.max_positions and max_seq_len > draft.max_positions:
        notes.append(f"draft was trained to {draft.max_positions} positions; acceptance drops on longer contexts (sglang #6783)")
    if draft:
        notes.append("draft weights counted BF16 and replicated per GPU (upper bound)")
    notes.append(f"GPU memory taken as nvidia-smi's total, {gpu.memory_mib} MiB = {gpu.memory_gb:.2f} GB; CUDA's own reserve comes out of the runtime reserve")
    return notes


# ---------------------------------------------------------------------------------------------
# Output


def _gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


def _bparams(n: int) -> str:
    return f"{n / 1e9:.2f} B"


def format_plan(plan: Plan) -> str:
    p, r = plan.target, plan.reserve
    spec = f"EAGLE-3 K={plan.max_draft_len}" if plan.speculative else "no speculation"
    lines = [
        f"plan: {plan.model} on {plan.num_gpus}x {plan.gpu} ({plan.gpu_memory_bytes / GB:.2f} GB each), "
        f"weights {plan.quant}, KV cache {plan.kv_cache_dtype}, {spec}, max_seq_len {plan.max_seq_len}",
        f"  layout      TP{plan.tp} x PP{plan.pp}, {plan.instances} instance(s) on GPUs {plan.gpu_device_ids}",
        f"  target      {_bparams(p.total)} params (embed {_bparams(p.embed)}, lm_head {_bparams(p.lm_head)}, "
        f"{p.layers} layers x {_bparams(p.attn_per_layer + p.mlp_per_layer)}); {_gb(plan.quantized_target_bytes)} at {plan.quant} "
        f"(embed/lm_head/norms BF16), {_gb(plan.target_checkpoint_bytes)} {(p.native_format or 'bf16').upper()} source",
    ]
    if plan.moe_ep:
        lines.append(
            f"  MoE         {p.experts} experts x {p.expert_weights_per_layer // p.experts / 1e6:.2f} M weights per layer, "
            f"{p.active_experts} active ({_bparams(p.active)} active params); EP{plan.moe_ep} x MoE-TP{plan.moe_tp}: "
            f"{plan.experts_per_gpu} experts per GPU, {_gb(plan.expert_bytes_per_gpu)} expert weights per GPU"
        )
    if plan.draft:
        lines.append(f"  draft       {_bparams(plan.draft.total)} params, {_gb(plan.draft_weight_bytes_per_gpu)} BF16 per GPU (replicated)")
    lines += [
        f"  per GPU     weights {_gb(plan.target_weight_bytes_per_gpu)} + draft {_gb(plan.draft_weight_bytes_per_gpu)} + reserve {_gb(r.total)}",
        f"  reserve     runtime {_gb(r.runtime)}, NCCL {_gb(r.nccl)}, activations {_gb(r.activations)}, "
        f"EAGLE-3 hidden {_gb(r.eagle3_hidden)}, logits {_gb(r.logits)}, CUDA graphs {_gb(r.cuda_graphs)}",
        f"  KV cache    {plan.kv_bytes_per_token / KIB:g} KiB/token/GPU (target {plan.kv_bytes_per_token_target / KIB:g} + draft "
        f"{plan.kv_bytes_per_token_draft / KIB:g})" + f"; {plan.free_gpu_memory_fraction:g} of the rest = {_gb(plan.kv_cache_bytes_per_gpu)} "
        f"-> {plan.kv_tokens:,} tokens = {plan.sequences_at_max_seq_len} sequences of {plan.max_seq_len} per instance",
        f"  runtime     max_batch_size {plan.max_batch_size}, max_num_tokens {plan.max_num_tokens}, "
        f"chunked prefill {'on' if plan.enable_chunked_prefill else 'off'}, CUDA graphs {list(plan.cuda_graph_batch_sizes)} (padding on)",
    ]
    lines += [f"  note        {n}" for n in plan.notes]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Steps of `make engine`, with rough durations

# Assumptions behind the durations (order of magnitude, for planning a session, not promises):
# sequential disk read/write incl. sha256 ~1 GB/s (NVMe or a fast network FS; hashing is one
# core at ~1-2 GB/s); ModelOpt calibration runs HF eager forwards with fake-quant at ~15% of one
# GPU's BF16 peak (device_map="auto" puts layers on GPUs one after another, so only one works at
# a time); TensorRT-LLM start-up (MPI spawn, imports, kernel autotuning) ~90 s; ~2 s to capture
# each CUDA graph for target plus draft; the smoke generation and alpha measurement ~60 s.
DISK_BYTES_PER_S = 1e9
CALIBRATION_MFU = 0.15
TRTLLM_STARTUP_S = 90
GRAPH_CAPTURE_S = 2
SMOKE_AND_ALPHA_S = 60


def _duration(seconds: float) -> str:
    if seconds < 60:
        return "<1 min"
    minutes = round(seconds / 60)
    return f"~{minutes} min" if minutes < 60 else f"~{minutes // 60} h {minutes % 60:02d} min"


def plan_steps(plan: Plan, calib_samples: int = 512, calib_len: int = 512) -> list[str]:
    """The steps `make engine` runs for this plan, each with a rough duration."""
    gpu = get_gpu(plan.gpu)
    draft_bytes = plan.draft_weight_bytes_per_gpu
    src = plan.target_checkpoint_bytes + draft_bytes
    steps = [f"validate target and draft (configs, tokenizer, safetensors headers, hash {_gb(src)}): {_duration(src / DISK_BYTES_PER_S)}"]
    if plan.quant in ("bf16", "native"):
        steps.append(f"quantize: skipped ({plan.quant} keeps the source weights)")
    else:
        tokens = calib_samples * calib_len
        flops = 2 * plan.target.total * tokens
        secs = plan.target_checkpoint_bytes / DISK_BYTES_PER_S + flops / (gpu.bf16_tflops * 1e12 * CALIBRATION_MFU)
        where = f"{plan.num_gpus}x {gpu.name}"
        if plan.target_checkpoint_bytes > plan.num_gpus * gpu.memory_bytes * 0.9:
            where += " (BF16 model exceeds GPU memory: ModelOpt offloads to CPU, expect several times longer)"
        steps.append(
            f"calibrate + quantize target to {plan.quant} with ModelOpt on {where}: load {_gb(plan.target_checkpoint_bytes)} BF16, "
            f"{calib_samples}x{calib_len} calibration tokens ({flops:.1e} FLOP): {_duration(secs)}"
        )
    out = plan.quantized_target_bytes + draft_bytes
    what = "copy the checkpoint as shipped" if plan.quant == "native" else "export quantized checkpoint"
    steps.append(f"{what} ({_gb(plan.quantized_target_bytes)}) and EAGLE-3 draft: {_duration(out / DISK_BYTES_PER_S)}")
    steps.append(f"bundle: write options, Triton model.yaml and manifest, hash {_gb(out)}: {_duration(out / DISK_BYTES_PER_S)}")
    # compile loads one instance; its ranks read their shards in parallel from one disk.
    read = plan.tp * plan.pp * (plan.target_weight_bytes_per_gpu + draft_bytes)
    secs = read / DISK_BYTES_PER_S + TRTLLM_STARTUP_S + GRAPH_CAPTURE_S * len(plan.cuda_graph_batch_sizes) + SMOKE_AND_ALPHA_S
    steps.append(
        f"compile on GPU (eagle3-trt compile): load TP{plan.tp} with EAGLE-3 one-model, capture "
        f"{len(plan.cuda_graph_batch_sizes)} CUDA graphs, smoke generation + alpha measurement: {_duration(secs)}"
    )
    return steps


# ---------------------------------------------------------------------------------------------
# Presets


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


def plan_for_preset(
    preset_name: str | Preset,
    gpu: str,
    gpus: int,
    quant: str | None,
    tp: int | None = None,
    *,
    target_cfg: dict[str, Any] | None = None,
    draft_cfg: dict[str, Any] | None = None,
    max_seq_len: int | None = None,
    max_batch_size: int | None = None,
    pp: int = 1,
) -> Plan:
    """Plan a registry preset from build/model_configs/<preset>/, a preset of the user's own
    (``plan --preset-file``) from its local or cached checkpoints' config.json, or explicit dicts."""
    own_file = isinstance(preset_name, Preset)
    preset = preset_name if isinstance(preset_name, Preset) else load_preset(preset_name)
    preset_name = preset.name
    spec = get_gpu(gpu)
    if target_cfg is None and own_file and not preset.target.embedded:
        # a preset of one's own: its checkpoints (local paths, or the HF cache) carry the configs
        tdir = resolve_source(preset.target, None, "target")
        ddir = resolve_source(preset.draft, None, "draft")
        assert tdir is not None and ddir is not None  # not embedded
        target_cfg, draft_cfg = read_config(tdir / "config.json"), read_config(ddir / "config.json")
    elif target_cfg is None:
        target_cfg, draft_cfg = _preset_configs(preset_name, bool(preset.target.embedded))
    # Per-generation default; a generation the preset does not name falls back to BF16.
    quant = quant or getattr(preset.quant, spec.generation, "bf16")
    # "auto" keeps the checkpoint's KV format, unknown before quantization: plan the larger BF16.
    kv = "fp8" if preset.kv_cache_dtype == "fp8" else "bf16"
    return make_plan(
        target_cfg,
        draft_cfg,
        spec,
        gpus,
        quant,
        max_seq_len or preset.max_seq_len,
        kv,  # type: ignore[arg-type]
        preset.max_draft_len,
        tp=tp,
        pp=pp,
        max_batch_size=max_batch_size,
        model=preset_name,
    )


def _preset_configs(preset_name: str, embedded: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    root = MODEL_CONFIG_DIR / preset_name
    if not root.is_dir():
        if embedded:
            raise UserError(
                f"MODEL={preset_name}",
                "embedded presets have no config-only files; they are planned from their generated files",
                "generate the pair first and pass its config.json files as target_cfg/draft_cfg",
            )
        raise UserError(f"MODEL={preset_name}", f"no config-only files under {root}", f"add {root}/target/config.json and draft/config.json")
    return read_config(root / "target" / "config.json"), read_config(root / "draft" / "config.json")
