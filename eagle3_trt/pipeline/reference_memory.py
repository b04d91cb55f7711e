"""What measuring a bundle with the reference runtime (alpha, gate, recommend) takes per GPU at a
tensor-parallel size, and about how long it runs: from config.json fields alone, before anything loads.

Memory per GPU (the most loaded rank, rank 0, whose slices are the larger ones where a split is uneven):
- target weights as the reference runtime holds them: dequantized to the measuring dtype (BF16 on a
  GPU, float32 on a CPU) whatever the bundle ships; q/k/v/o and gate/up/down split over the ranks
  (formats/tp_layout.py), embedding, lm_head and norms replicated on every rank;
- the draft head whole on every rank, same dtype;
- the KV cache of the target's slice: 2 (K, V) x layers x the rank's KV heads x head_dim x dtype bytes,
  for ``batch`` sequences of ``context`` tokens;
- the largest activation: the draft's float32 logits over every position of the batch in one of
  the estimator's teacher-forced passes (measure/estimator.py), batch x context x draft vocabulary x 4.

Time (``alpha_time_s``): decoding is memory-bound, so each target forward reads the rank's weights
and KV once at a fraction ``HBM_EFFICIENCY`` of the GPU's HBM bandwidth, plus two all-reduces per
layer at ``ALLREDUCE_S`` each when split; the draft adds K forwards over its weights per target forward;
the prefill is compute-bound at ``FLOPS_EFFICIENCY`` of the BF16 peak. An estimate to plan a GPU
booking with, not a benchmark: eager PyTorch runs well below these rooflines on small batches.
"""

from __future__ import annotations

import math
import os
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
    activations: int  # the draft's float32 logits over batch x context positions
    batch: int
    context: int
    layers: int

    @property
    def total(self) -> int:
        return self.target_weights + self.draft_weights + self.kv + self.activations

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}

    def line(self) -> str:
        weights = f"{self.target_weights / GIB:.1f} GiB target weights + {self.draft_weights / GIB:.1f} GiB draft"
        if not self.context:  # weights alone: what must fit before the first batch
            return f"{self.total / GIB:.1f} GiB per GPU at TP={self.tp} ({weights})"
        return (
            f"{self.total / GIB:.1f} GiB per GPU at TP={self.tp} ({weights} + {self.kv / GIB:.1f} GiB KV and "
            f"{self.activations / GIB:.1f} GiB draft logits for {self.batch} x {self.context} tokens)"
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
    d = count_draft(draft_cfg, s) if draft_cfg is not None else None
    kv = 2 * s.layers * (k1 - k0) * head_dim * dtype_bytes * batch * context
    logits = batch * context * (d.draft_vocab if d is not None else s.vocab) * 4
    return ReferenceMemory(tp, dtype_bytes, params * dtype_bytes, (d.total if d else 0) * dtype_bytes, kv, logits, batch, context, s.layers)


def device_shortfall(target_cfg: dict[str, Any], draft_cfg: dict[str, Any] | None, tp: int, device: str) -> str | None:
    """None when one rank's slice of the target at ``tp``, the draft and a margin of 10% fit ``device``
    (dequantized to the measuring dtype: BF16 on a GPU, float32 on a CPU, where the ranks share the
    host's memory), else "needs ... and ... has ..."."""
    import torch  # only here: the plan's figures need no torch

    dtype_bytes = 2 if device.startswith("cuda") else 4
    try:
        mem = reference_memory(target_cfg, draft_cfg, tp, dtype_bytes=dtype_bytes)
    except (KeyError, TypeError, ValueError, UserError):  # a head whose config the planner does not size: the target alone
        mem = reference_memory(target_cfg, None, tp, dtype_bytes=dtype_bytes)
    if device.startswith("cuda"):
        dev = torch.device(device)
        have, need, where = torch.cuda.get_device_properties(dev).total_memory, mem.total, f"one {torch.cuda.get_device_name(dev)}"
    else:
        have, need, where = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), mem.total * tp, "this host's free memory"
    if need * 1.1 <= have:
        return None
    return f"needs {mem.line()} and {where} has {have / GIB:.1f} GiB"


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


# alpha's defaults (measure/commands.py: --batch-size 16, --max-tokens 128), and a prompt length to price
MEASURE_BATCH, MEASURE_MAX_TOKENS, MEASURE_PROMPT_TOKENS = 16, 128, 512
PLAN_PROMPTS = 1000
# head room kept on each GPU beyond the figures above (CUDA context, allocator slack, activations)
FIT_MARGIN = 1.1


@dataclass(frozen=True)
class MeasurePlan:
    """``plan --measure``: alpha/gate with the reference runtime at a TP size on the node's GPUs."""

    gpu: str
    num_gpus: int
    gpu_memory_bytes: int
    memory: ReferenceMemory
    prompt_tokens: int
    max_tokens: int
    k: int
    time: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "num_gpus": self.num_gpus,
            "tp": self.memory.tp,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "memory_per_gpu": self.memory.to_dict(),
            "prompts": PLAN_PROMPTS,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "max_draft_len": self.k,
            "time": self.time,
        }

    def lines(self) -> list[str]:
        m, t = self.memory, self.time
        return [
            f"measuring (alpha, gate, recommend --prompts) with the reference runtime at TP={m.tp} on {m.tp} of {self.num_gpus}x {self.gpu} "
            f"({'BF16' if m.dtype_bytes == 2 else 'float32'}, weights dequantized):",
            f"  memory  {m.line()} of {self.gpu_memory_bytes / GIB:.1f} GiB",
            f"  time    per {PLAN_PROMPTS:,} prompts ~{t['total_s'] / 60:.1f} min ({int(t['batches'])} batches of {m.batch}: prefill of {self.prompt_tokens} tokens "
            f"{t['prefill_s']:.2f} s + {self.max_tokens} target steps x {t['target_step_s'] * 1e3:.1f} ms + K={self.k} draft passes {t['draft_passes_s']:.2f} s)",
            f"  command eagle3-trt alpha BUNDLE --prompts FILE --tp {m.tp}   (gate BUNDLE --prompts FILE --tp {m.tp}; recommend ... --measure-tp {m.tp})",
        ]


def measure_plan(
    target_cfg: dict[str, Any],
    draft_cfg: dict[str, Any] | None,
    gpu: GpuSpec,
    num_gpus: int,
    k: int,
    *,
    tp: int | None = None,
    batch: int = MEASURE_BATCH,
    prompt_tokens: int = MEASURE_PROMPT_TOKENS,
    max_tokens: int = MEASURE_MAX_TOKENS,
) -> MeasurePlan:
    """The reference measurement at ``tp`` (default: the smallest TP the heads split into that fits,
    ``FIT_MARGIN`` kept free), or the one-line reason it does not fit even on all ``num_gpus``."""
    if tp is not None and not 1 <= tp <= num_gpus:
        raise UserError("--measure-tp", f"{tp} with {num_gpus} GPUs", f"use 1..{num_gpus} (one rank per GPU)")
    context = prompt_tokens + max_tokens
    fits = last = None
    for t in [tp] if tp is not None else range(1, num_gpus + 1):
        try:
            last = reference_memory(target_cfg, draft_cfg, t, dtype_bytes=2, batch=batch, context=context)
        except UserError:
            if tp is not None:
                raise
            continue  # the heads do not split this way
        if last.total * FIT_MARGIN <= gpu.memory_bytes:
            fits = last
            break
    if fits is None:
        needs = last.line() if last is not None else f"a TP size up to {num_gpus} that splits the heads"
        raise UserError(
            "--measure-tp" if tp is not None else "--gpus",
            f"the reference measurement does not fit: it needs {needs}, and a {gpu.name} has {gpu.memory_bytes / GIB:.1f} GiB",
            "more GPUs, GPUs with more memory, or a smaller --measure-batch",
        )
    mem = fits
    active = count_target(parse_shape(target_cfg, "target config.json")).active
    time = alpha_time_s(mem, gpu, prompts=PLAN_PROMPTS, prompt_tokens=prompt_tokens, max_tokens=max_tokens, k=k, active_params=active)
    return MeasurePlan(gpu.name, num_gpus, gpu.memory_bytes, mem, prompt_tokens, max_tokens, k, time)
