"""Config-only deployment planner: the parallel layout, batch limits and serving options of one
deployment, from config.json alone.

Everything here is arithmetic on Hugging Face config fields, so a plan can be made on any
machine, without weights, torch or TensorRT-LLM. Figures are per GPU unless named otherwise.
The sizes come from pipeline/model_size.py (shape, parameter counts) and pipeline/memory.py
(weights, KV cache and reserve per GPU, and its sharding model); requests that cannot work are
refused by pipeline/plan_checks.py; the plan is printed by pipeline/plan_report.py and made for a
preset by pipeline/plan_presets.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import family_named
from eagle3_trt.pipeline.gpus import GpuSpec
from eagle3_trt.pipeline.memory import (
    DEFAULT_MAX_NUM_TOKENS,
    MAX_BATCH_CAP,
    Budget,
    Reserve,
    graph_batch_sizes,
    kv_budget,
    target_weight_bytes,
)
from eagle3_trt.pipeline.model_size import (
    BF16_BYTES,
    GB,
    LINEAR_BYTES,
    DraftParams,
    LlamaShape,
    TargetParams,
    bparams,
    count_draft,
    count_target,
    parse_shape,
)
from eagle3_trt.pipeline.plan_checks import check_inputs

KvDtype = Literal["fp8", "bf16"]

# A TP layout "fits" only if it holds at least this many sequences of max_seq_len tokens at
# once: one full-length sequence would make the KV budget the bottleneck for any real traffic.
MIN_FULL_SEQUENCES = 4


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


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


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
    check_inputs(s, gpu, num_gpus, quant, kv_cache_dtype, max_seq_len, max_draft_len, tp, pp, speculative, max_batch_size)
    p = count_target(s)

    fam = family_named(s.family)

    def budget(t: int, mbs: int) -> Budget:
        mnt = max(DEFAULT_MAX_NUM_TOKENS, mbs * (k + 1))
        return kv_budget(gpu, s, p, draft, quant, kv_cache_dtype, t, pp, max_seq_len, k, mnt, mbs, fam.kv_free_gpu_memory_fraction)

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
    return _plan(model, s, p, draft, gpu, num_gpus, t, pp, quant, kv_cache_dtype, max_seq_len, k, mbs, final, auto_tp=tp is None)


def _expert_bytes_per_gpu(s: LlamaShape, p: TargetParams, quant: str, t: int, pp: int, ep: int) -> int:
    if not s.experts:
        return 0
    eb = LINEAR_BYTES[p.native_format if quant == "native" else quant]  # type: ignore[index]
    # each GPU holds experts/ep experts, each split moe_tp = tp/ep ways
    return int(round(math.ceil(s.layers / pp) * (s.experts // ep) * (p.expert_weights_per_layer // s.experts) * eb / (t // ep)))


def _plan(
    model: str,
    s: LlamaShape,
    p: TargetParams,
    draft: DraftParams | None,
    gpu: GpuSpec,
    num_gpus: int,
    t: int,
    pp: int,
    quant: str,
    kv_cache_dtype: KvDtype,
    max_seq_len: int,
    k: int,
    mbs: int,
    final: Budget,
    *,
    auto_tp: bool,
) -> Plan:
    """The plan of the chosen layout (TP ``t``, batch size ``mbs``) from its final KV budget."""
    fam = family_named(s.family)
    max_num_tokens = max(DEFAULT_MAX_NUM_TOKENS, mbs * (k + 1))
    instances = num_gpus // (t * pp)
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
        speculative=draft is not None,
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
        notes=tuple(_notes(s, draft, gpu, num_gpus, t, pp, instances, max_seq_len, auto_tp, quant, kv_cache_dtype, p)),
        kv_block_reuse=fam.kv_block_reuse,
        **_moe_fields(s, p, gpu, quant, t, pp),
    )


def _moe_fields(s: LlamaShape, p: TargetParams, gpu: GpuSpec, quant: str, t: int, pp: int) -> dict[str, Any]:
    """The plan's MoE layout at TP ``t`` (zeros and no backend for a dense target)."""
    ep = moe_ep_size(s, t)
    return {
        "moe_ep": ep,
        "moe_tp": t // ep if ep else 0,
        "experts_per_gpu": s.experts // ep if ep else 0,
        "expert_bytes_per_gpu": _expert_bytes_per_gpu(s, p, quant, t, pp, ep),
        "moe_backend": family_named(s.family).moe_backend.get(gpu.generation) if s.experts else None,
    }


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
    tried: list[tuple[int, Budget]],
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
        if kv_budget(gpu, s, p, draft, quant, kv_dtype, t, pp, max_seq_len, k, DEFAULT_MAX_NUM_TOKENS, MAX_BATCH_CAP).sequences >= MIN_FULL_SEQUENCES:
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
            f"MoE: {s.experts} experts per layer, {s.active_experts} per token: {bparams(p.active)} active params per token "
            f"(without the embedding table) of {bparams(p.total)}"
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
