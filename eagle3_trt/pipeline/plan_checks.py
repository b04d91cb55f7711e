"""The planner's refusals: requests no layout can serve (format, GPU count, lengths, TP/PP),
checked before any memory arithmetic, each naming the option to change."""

from __future__ import annotations

from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import family_named, quant_refusal
from eagle3_trt.pipeline.gpus import GpuSpec, check_quant_for_gpu
from eagle3_trt.pipeline.model_size import KV_BYTES, LlamaShape


def check_inputs(
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
