"""What measuring a bundle with the reference runtime (alpha, gate, recommend) takes per GPU at a
tensor-parallel size, and about how long it runs: from config.json fields alone, before anything loads.

Memory per GPU (the most loaded rank, rank 0, whose slices are the larger ones where a split is uneven):
- target weights as the reference runtime holds them: dequantized to the measuring dtype (BF16 on a
  GPU, float32 on a CPU) whatever the bundle ships; q/k/v/o and gate/up/down split over the ranks
  (formats/tp_layout.py), embedding, lm_head and norms replicated on every rank;
- the draft head whole on every rank, same dtype;
- the KV cache of the target's slice: 2 (K, V) x layers x the rank's KV heads x head_dim x dtype bytes,
  for ``batch`` sequences of ``context`` tokens.

Time (``alpha_time_s``): decoding is memory-bound, so each target forward reads the rank's weights
and KV once at a fraction ``HBM_EFFICIENCY`` of the GPU's HBM bandwidth, plus two all-reduces per
layer at ``ALLREDUCE_S`` each when split; the draft adds K forwards over its weights per target forward;
the prefill is compute-bound at ``FLOPS_EFFICIENCY`` of the BF16 peak. An estimate to plan a GPU
booking with, not a benchmark: eager PyTorch runs well below these rooflines on small batches.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.formats.tp_layout import even_split, head_ranges, heads_of, refuse_unsplittable
from eagle3_trt.pipeline.gpus import GpuSpec
from eagle3_trt.pipeline.model_size import count_draft, count_target, parse_shape

# fraction of HBM bandwidth a decode step of the eager reference runtime reaches (large GEMVs)
HBM_EFFICIENCY = 0.5
# fraction of BF16 peak a prefill reaches
FLOPS_EFFICIENCY = 0.3
# one small all-reduce of a decode step's hidden states over NVLink (latency-bound)
ALLREDUCE_S = 20e-6
GIB = 2**30


@dataclass(frozen=True)
class ReferenceMemory:
    tp: int
    dtype_bytes: int
    target_weights: int  # bytes on the most loaded GPU
    draft_weights: int
    kv: int  # bytes for batch x context tokens on the most loaded GPU
    batch: int
    context: int
    layers: int

    @property
    def total(self) -> int:
        return self.target_weights + self.draft_weights + self.kv

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}

    def line(self) -> str:
        return (
            f"{self.total / GIB:.1f} GiB per GPU at TP={self.tp} ({self.target_weights / GIB:.1f} GiB target weights + "
            f"{self.draft_weights / GIB:.1f} GiB draft + {self.kv / GIB:.1f} GiB KV for {self.batch} x {self.context} tokens)"
        )


def reference_memory(
    target_cfg: dict[str, Any], draft_cfg: dict[str, Any] | None, tp: int, *, dtype_bytes: int = 2, batch: int = 1, context: int = 0
) -> ReferenceMemory:
    """Bytes per GPU of the reference runtime's target slice, the replicated draft and the KV cache."""
    if tp < 1:
        raise UserError("--tp", f"{tp}", "tensor parallelism is at least 1")
    refuse_unsplittable(target_cfg, tp)
    s = parse_shape(target_cfg, "target config.json")
    p = count_target(s)
    n_heads, n_kv, head_dim = heads_of(target_cfg)
    (q0, q1), (k0, k1) = head_ranges(n_heads, n_kv, tp, 0)
    i0, i1 = even_split(s.intermediate, tp, 0)
    q_out, kv_out = (q1 - q0) * head_dim, (k1 - k0) * head_dim
    attn = s.hidden * q_out + 2 * s.hidden * kv_out + q_out * s.hidden + ((q_out + 2 * kv_out + s.hidden) if s.attn_bias else 0)
    mlp = 3 * s.hidden * (i1 - i0)
    params = s.layers * (attn + mlp) + p.norms + p.embed + p.lm_head
    draft = count_draft(draft_cfg, s).total if draft_cfg is not None else 0
    kv = 2 * s.layers * (k1 - k0) * head_dim * dtype_bytes * batch * context
    return ReferenceMemory(tp, dtype_bytes, params * dtype_bytes, draft * dtype_bytes, kv, batch, context, s.layers)


def alpha_time_s(mem: ReferenceMemory, gpu: GpuSpec, *, prompts: int, prompt_tokens: int, max_tokens: int, k: int, active_params: int) -> dict[str, float]:
    """Seconds for ``alpha`` (the estimator) on ``prompts`` prompts in batches of ``mem.batch``, by the
    roofline in this module's docstring. Per batch: the target's prefill of ``prompt_tokens`` per
    prompt, ``max_tokens`` greedy decode steps, and the draft's K teacher-forced passes over each whole
    sequence (measure/estimator.py). ``active_params``: the target's parameters a token runs through."""
    batches = math.ceil(prompts / mem.batch)
    bw = gpu.bandwidth_tbs * 1e12 * HBM_EFFICIENCY
    flops = gpu.bf16_tflops * 1e12 * FLOPS_EFFICIENCY
    kv_step = mem.kv * (prompt_tokens + max_tokens / 2) / max(mem.context, 1)  # KV read per step, at the mean context
    allreduce = 2 * mem.layers * ALLREDUCE_S if mem.tp > 1 else 0.0
    target_step = (mem.target_weights + kv_step) / bw + allreduce
    prefill = 2 * active_params / mem.tp * mem.batch * prompt_tokens / flops
    draft_params = mem.draft_weights / mem.dtype_bytes
    draft_passes = k * (mem.draft_weights / bw + 2 * draft_params * mem.batch * (prompt_tokens + max_tokens) / flops)
    per_batch = prefill + max_tokens * target_step + draft_passes
    return {
        "batches": batches,
        "prefill_s": prefill,
        "target_step_s": target_step,
        "draft_passes_s": draft_passes,
        "per_batch_s": per_batch,
        "total_s": batches * per_batch,
    }
