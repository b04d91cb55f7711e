"""A plan as the `plan` command and `make engine` print it: the figures, and the steps of `make engine` with rough durations."""

from __future__ import annotations

from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.model_size import GB, KIB, bparams, gb
from eagle3_trt.pipeline.planner import Plan


def format_plan(plan: Plan) -> str:
    p, r = plan.target, plan.reserve
    spec = f"EAGLE-3 K={plan.max_draft_len}" if plan.speculative else "no speculation"
    lines = [
        f"plan: {plan.model} on {plan.num_gpus}x {plan.gpu} ({plan.gpu_memory_bytes / GB:.2f} GB each), "
        f"weights {plan.quant}, KV cache {plan.kv_cache_dtype}, {spec}, max_seq_len {plan.max_seq_len}",
        f"  layout      TP{plan.tp} x PP{plan.pp}, {plan.instances} instance(s) on GPUs {plan.gpu_device_ids}",
        f"  target      {bparams(p.total)} params (embed {bparams(p.embed)}, lm_head {bparams(p.lm_head)}, "
        f"{p.layers} layers x {bparams(p.attn_per_layer + p.mlp_per_layer)}); {gb(plan.quantized_target_bytes)} at {plan.quant} "
        f"(embed/lm_head/norms BF16), {gb(plan.target_checkpoint_bytes)} {(p.native_format or 'bf16').upper()} source",
    ]
    if plan.moe_ep:
        lines.append(
            f"  MoE         {p.experts} experts x {p.expert_weights_per_layer // p.experts / 1e6:.2f} M weights per layer, "
            f"{p.active_experts} active ({bparams(p.active)} active params); EP{plan.moe_ep} x MoE-TP{plan.moe_tp}: "
            f"{plan.experts_per_gpu} experts per GPU, {gb(plan.expert_bytes_per_gpu)} expert weights per GPU"
        )
    if plan.draft:
        lines.append(f"  draft       {bparams(plan.draft.total)} params, {gb(plan.draft_weight_bytes_per_gpu)} BF16 per GPU (replicated)")
    lines += [
        f"  per GPU     weights {gb(plan.target_weight_bytes_per_gpu)} + draft {gb(plan.draft_weight_bytes_per_gpu)} + reserve {gb(r.total)}",
        f"  reserve     runtime {gb(r.runtime)}, NCCL {gb(r.nccl)}, activations {gb(r.activations)}, "
        f"EAGLE-3 hidden {gb(r.eagle3_hidden)}, logits {gb(r.logits)}, CUDA graphs {gb(r.cuda_graphs)}",
        f"  KV cache    {plan.kv_bytes_per_token / KIB:g} KiB/token/GPU (target {plan.kv_bytes_per_token_target / KIB:g} + draft "
        f"{plan.kv_bytes_per_token_draft / KIB:g})" + f"; {plan.free_gpu_memory_fraction:g} of the rest = {gb(plan.kv_cache_bytes_per_gpu)} "
        f"-> {plan.kv_tokens:,} tokens = {plan.sequences_at_max_seq_len} sequences of {plan.max_seq_len} per instance",
        f"  runtime     max_batch_size {plan.max_batch_size}, max_num_tokens {plan.max_num_tokens}, "
        f"chunked prefill {'on' if plan.enable_chunked_prefill else 'off'}, CUDA graphs {list(plan.cuda_graph_batch_sizes)} (padding on)",
    ]
    lines += [f"  note        {n}" for n in plan.notes]
    return "\n".join(lines)


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


def plan_steps(plan: Plan, calib_samples: int = 512, calib_len: int = 512, calib_available: int | None = None) -> list[str]:
    """The steps `make engine` runs for this plan, each with a rough duration. ``calib_available``:
    prompts in the default calibration file, when it has fewer than the preset asks for."""
    gpu = get_gpu(plan.gpu)
    draft_bytes = plan.draft_weight_bytes_per_gpu
    src = plan.target_checkpoint_bytes + draft_bytes
    steps = [f"validate target and draft (configs, tokenizer, safetensors headers, hash {gb(src)}): {_duration(src / DISK_BYTES_PER_S)}"]
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
            f"calibrate + quantize target to {plan.quant} with ModelOpt on {where}: load {gb(plan.target_checkpoint_bytes)} BF16, "
            f"{calib_samples}x{calib_len} calibration tokens ({flops:.1e} FLOP): {_duration(secs)}"
            + (
                f"; needs your calibration data: the shipped set has {calib_available} prompts, so pass --calib FILE with {calib_samples} "
                "(without it the build calibrates on those, warns and records the shortfall in the manifest)"
                if calib_available is not None and calib_available < calib_samples
                else ""
            )
        )
    out = plan.quantized_target_bytes + draft_bytes
    what = "copy the checkpoint as shipped" if plan.quant == "native" else "export quantized checkpoint"
    steps.append(f"{what} ({gb(plan.quantized_target_bytes)}) and EAGLE-3 draft: {_duration(out / DISK_BYTES_PER_S)}")
    steps.append(f"bundle: write options, Triton model.yaml and manifest, hash {gb(out)}: {_duration(out / DISK_BYTES_PER_S)}")
    # compile loads one instance; its ranks read their shards in parallel from one disk.
    read = plan.tp * plan.pp * (plan.target_weight_bytes_per_gpu + draft_bytes)
    secs = read / DISK_BYTES_PER_S + TRTLLM_STARTUP_S + GRAPH_CAPTURE_S * len(plan.cuda_graph_batch_sizes) + SMOKE_AND_ALPHA_S
    steps.append(
        f"compile on GPU (eagle3-trt compile): load TP{plan.tp} with EAGLE-3 one-model, capture "
        f"{len(plan.cuda_graph_batch_sizes)} CUDA graphs, smoke generation + alpha measurement: {_duration(secs)}"
    )
    return steps
