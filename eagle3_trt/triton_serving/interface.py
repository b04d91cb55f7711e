"""The model's tensor interface: TensorRT-LLM's Triton ``llmapi`` model plus a few extras.

This table is what a generated (or hand-edited) ``config.pbtxt`` is checked against, and
what the model reads. Names and types follow upstream's llmapi ``config.pbtxt``
(NVIDIA/TensorRT-LLM ``triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt``, listed in
triton-inference-server/tensorrtllm_backend ``docs/llmapi.md``) so that clients written for that
model work unchanged; the extras are optional inputs upstream clients never send and outputs
they never ask for.

One deliberate difference: the integer inputs (``sampling_param_max_tokens``, ``_top_k``,
``_best_of``) are INT64, not upstream's INT32. Triton's JSON reader truncates a JSON integer into
a 32-bit input without a word (4294967301 arrives as 5, 2147483648 as -2147483648); at 64 bits
every JSON integer a client can send arrives intact and ``request_params`` range-checks it.
tritonclient code written for upstream must send these three as INT64; this project's client
reads the declared type from the model's metadata and works with either.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton config name, e.g. "TYPE_INT32"
    dims: tuple[int, ...]
    optional: bool = True
    extra: bool = False  # not part of upstream's llmapi interface
    doc: str = ""


INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "TYPE_STRING", (-1,), optional=False, doc="prompt, sent as-is (apply the chat template client-side)"),
    TensorSpec("streaming", "TYPE_BOOL", (1,), doc="one response per decoding step instead of one at the end"),
    TensorSpec("sampling_param_best_of", "TYPE_INT64", (1,), doc="only 1 is supported"),
    TensorSpec("sampling_param_temperature", "TYPE_FP32", (1,), doc=">= 0; 0 means greedy (default)"),
    TensorSpec("sampling_param_top_k", "TYPE_INT64", (1,), doc=">= 0; 0 disables"),
    TensorSpec("sampling_param_top_p", "TYPE_FP32", (1,), doc="in (0, 1]"),
    TensorSpec("sampling_param_frequency_penalty", "TYPE_FP32", (1,), doc="trtllm runtime only"),
    TensorSpec("sampling_param_presence_penalty", "TYPE_FP32", (1,), doc="trtllm runtime only"),
    TensorSpec("sampling_param_max_tokens", "TYPE_INT64", (1,), doc="1 .. bundle max_seq_len - prompt length"),
    TensorSpec("sampling_param_stop", "TYPE_STRING", (-1,), doc="stop strings"),
    TensorSpec("sampling_param_seed", "TYPE_UINT64", (1,), doc="sampling seed"),
    TensorSpec("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,), doc="default false: text_output starts with the prompt"),
    TensorSpec("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,), doc="send timing and speculative-decoding outputs"),
    TensorSpec("return_finish_reason", "TYPE_BOOL", (1,), doc="accepted for compatibility; finish_reason is always sent"),
    TensorSpec("return_stop_reason", "TYPE_BOOL", (1,), doc="send stop_reason"),
    TensorSpec("return_cumulative_logprob", "TYPE_BOOL", (1,), doc="not supported (error when true)"),
    TensorSpec("stop", "TYPE_BOOL", (1,), doc="cancel the in-flight requests that carry this request id"),
    TensorSpec("speculative_decoding", "TYPE_BOOL", (1,), extra=True, doc="default true; false serves this request without the draft (A/B)"),
)

OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_output", "TYPE_STRING", (-1,), doc="streaming: the text of this step; otherwise the whole text"),
    TensorSpec("finish_reason", "TYPE_STRING", (-1,), doc="stop | length | cancelled, on the final response"),
    TensorSpec("stop_reason", "TYPE_STRING", (-1,)),
    TensorSpec("cumulative_logprob", "TYPE_FP32", (-1,)),
    TensorSpec("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    TensorSpec("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    TensorSpec("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    TensorSpec("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    TensorSpec("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    TensorSpec("arrival_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("first_token_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("last_token_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("acceptance_rate", "TYPE_FP32", (1,)),
    TensorSpec("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    TensorSpec("total_draft_tokens", "TYPE_INT32", (1,)),
    TensorSpec("num_output_tokens", "TYPE_INT32", (1,), extra=True, doc="tokens in this response"),
    TensorSpec("acceptance_length", "TYPE_FP32", (1,), extra=True, doc="mean tokens per target forward so far"),
    TensorSpec("speculative_decoding", "TYPE_BOOL", (1,), extra=True, doc="whether the draft was used"),
)

INPUT_BY_NAME = {t.name: t for t in INPUTS}
OUTPUT_BY_NAME = {t.name: t for t in OUTPUTS}

PERF_OUTPUTS = (
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "acceptance_length",
    "speculative_decoding",
)
