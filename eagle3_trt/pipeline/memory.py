"""Per-GPU memory of a deployment: weight bytes under tensor/pipeline parallelism, the KV cache per
token, the reserve held outside both, and the KV budget that is left.

GPU memory is the total nvidia-smi reports (``GpuSpec.memory_mib``), not the marketing figure:
an "80 GB" H100 has 81559 MiB = 85.52 GB.

Sharding model (TensorRT-LLM PyTorch backend, tensor parallelism ``tp``):
- every attention and MLP Linear is split ``tp`` ways (q/k/v/gate/up by column, o/down by row);
- the embedding and lm_head are split ``tp`` ways as well (vocab-parallel);
- RMSNorm weights are replicated;
- the KV cache holds ``num_key_value_heads / tp`` heads per GPU;
- pipeline parallelism ``pp`` gives each stage ``ceil(layers / pp)`` layers; the first stage
  holds the embedding and the last the lm_head, so the worst stage holds one of them.
The EAGLE-3 draft head is counted in BF16 and replicated on every GPU (an upper bound; see
``draft_weight_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.gpus import GpuSpec
from eagle3_trt.pipeline.model_size import BF16_BYTES, EAGLE3_CAPTURED_LAYERS, KV_BYTES, LINEAR_BYTES, DraftParams, LlamaShape, TargetParams

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


def draft_weight_bytes(d: DraftParams | None) -> int:
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


def reserve_bytes(
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


def graph_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two up to max_batch_size, plus max_batch_size itself; padding covers the gaps."""
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size]
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return tuple(sizes)


@dataclass(frozen=True)
class Budget:
    weights: int
    draft: int
    kv_target: int
    kv_draft: int
    reserve: Reserve
    kv_cache: int
    kv_tokens: int
    sequences: int


def kv_budget(
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
) -> Budget:
    weights = target_weight_bytes(p, quant, tp, pp)
    draft_bytes = draft_weight_bytes(draft)
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
    reserve = reserve_bytes(s, draft, tp, pp, max_num_tokens, max_batch_size, max_draft_len, len(graph_batch_sizes(max_batch_size)))
    free = gpu.memory_bytes - weights - draft_bytes - reserve.total
    kv_cache = max(0, int(free * free_fraction))
    block = (kv_t + kv_d) * TOKENS_PER_BLOCK
    blocks = kv_cache // block
    # Each sequence also holds its K draft tokens' KV while they are verified.
    blocks_per_seq = math.ceil((max_seq_len + max_draft_len) / TOKENS_PER_BLOCK)
    return Budget(weights, draft_bytes, kv_t, kv_d, reserve, kv_cache, blocks * TOKENS_PER_BLOCK, blocks // blocks_per_seq)
