"""Which ``LLM(...)`` option names a TensorRT-LLM release accepts, and the check that refuses
the others before a load that can take many minutes.

Two sources: the installed ``TorchLlmArgs`` field list (exact, read only when TensorRT-LLM is
importable) and ``DOCUMENTED_TOP_LEVEL`` / ``DOCUMENTED_NESTED`` below, the union of the names documented from 1.2.x on.
pipeline/trtllm_adapter.py checks every set of kwargs it writes against one of them.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.llm_options import VLLM_ONLY_FIELDS
from eagle3_trt.pipeline.trtllm_versions import installed_version

# The name the messages use for the bundle's options file (build/bundle.py owns the file).
OPTIONS_FILE = "llm_api_options.yaml"

# Option names documented for TorchLlmArgs (BaseLlmArgs + TorchLlmArgs) from 1.2.x to the 2026
# main branch [NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py]. Names that exist only in some
# releases are included: this table catches typos when TensorRT-LLM is not importable; the
# installed field list is exact and wins whenever it can be read.
DOCUMENTED_TOP_LEVEL: frozenset[str] = frozenset(
    [
        "model",
        "tokenizer",
        "tokenizer_mode",
        "custom_tokenizer",
        "skip_tokenizer_init",
        "trust_remote_code",
        "tensor_parallel_size",
        "dtype",
        "revision",
        "tokenizer_revision",
        "model_kwargs",
        "pipeline_parallel_size",
        "context_parallel_size",
        "gpus_per_node",
        "moe_cluster_parallel_size",
        "moe_tensor_parallel_size",
        "moe_expert_parallel_size",
        "enable_attention_dp",
        "enable_lm_head_tp_in_adp",
        "pp_partition",
        "cp_config",
        "load_format",
        "enable_lora",
        "lora_config",
        "kv_cache_config",
        "enable_chunked_prefill",
        "guided_decoding_backend",
        "batched_logits_processor",
        "iter_stats_max_iterations",
        "request_stats_max_iterations",
        "peft_cache_config",
        "scheduler_config",
        "cache_transceiver_config",
        "sparse_attention_config",
        "speculative_config",
        "max_batch_size",
        "max_input_len",
        "max_seq_len",
        "max_beam_width",
        "max_num_tokens",
        "gather_generation_logits",
        "num_postprocess_workers",
        "postprocess_tokenizer_dir",
        "reasoning_parser",
        "decoding_config",
        "otlp_traces_endpoint",
        "backend",
        "return_perf_metrics",
        "prometheus_metrics_config",
        "orchestrator_type",
        "env_overrides",
        "garbage_collection_gen0_threshold",
        "cuda_graph_config",
        "attention_dp_config",
        "disable_overlap_scheduler",
        "moe_config",
        "attn_backend",
        "sampler_type",
        "enable_iter_perf_stats",
        "enable_iter_req_stats",
        "print_iter_log",
        "batch_wait_timeout_ms",
        "batch_wait_timeout_iters",
        "batch_wait_max_tokens_ratio",
        "torch_compile_config",
        "enable_autotuner",
        "enable_layerwise_nvtx_marker",
        "enable_min_latency",
        "stream_interval",
        "force_dynamic_quantization",
        "allreduce_strategy",
        "checkpoint_loader",
        "checkpoint_format",
        "kv_connector_config",
        "mm_encoder_only",
        "max_stats_len",
    ]
)
# Nested configs the bundle writes. Eagle3DecodingConfig = DecodingBaseConfig + EagleDecodingConfig
# fields (1.2.x .. 1.4.0rc1 reference pages); KvCacheConfig and CudaGraphConfig likewise.
DOCUMENTED_NESTED: dict[str, frozenset[str]] = {
    "speculative_config": frozenset(
        [
            "decoding_type",
            "max_draft_len",
            "max_total_draft_tokens",
            "speculative_model",
            "speculative_model_dir",
            "eagle3_one_model",
            "eagle3_layers_to_capture",
            "eagle3_model_arch",
            "num_eagle_layers",
            "max_non_leaves_per_layer",
            "eagle_choices",
            "greedy_sampling",
            "posterior_threshold",
            "use_dynamic_tree",
            "dynamic_tree_max_topK",
            "max_concurrency",
            "draft_len_schedule",
            "load_format",
            "acceptance_rate_window_size",
            "acceptance_rate_threshold",
            "use_rejection_sampling",
            "allow_advanced_sampling",  # 1.2.x .. 1.4.0rc1 (core/spec_sampling.py)
            "advanced_sampling_mode",  # 1.3.0rc27 / 1.4.0rc1 reference pages
            "enable_penalty",
            "spec_dec_variant",  # 1.4.0rc1 reference page; older releases: speculative/eagle3/release.py leaves it out
            "sa_config",  # SAEnhancerConfig, 1.3+ (PR #12130); older releases: trtllm_versions.spec_for_release refuses it
        ]
    ),
    "kv_cache_config": frozenset(
        [
            "enable_block_reuse",
            "max_tokens",
            "max_attention_window",
            "sink_token_length",
            "free_gpu_memory_fraction",
            "host_cache_size",
            "onboard_blocks",
            "cross_kv_cache_fraction",
            "secondary_offload_min_priority",
            "event_buffer_max_size",
            "attention_dp_events_gather_period_ms",
            "enable_partial_reuse",
            "copy_on_partial_reuse",
            "use_uvm",
            "max_gpu_total_bytes",
            "dtype",
            "mamba_ssm_cache_dtype",
            "tokens_per_block",
        ]
    ),
    "cuda_graph_config": frozenset(["batch_sizes", "max_batch_size", "enable_padding"]),
}
# Option fields the bundle schema holds that are NOT TensorRT-LLM's: set only in bundles of a method no
# TensorRT-LLM release serves, which compile, Triton and Dynamo refuse before any kwargs are written
# (other_engines.trtllm_refusal); the name check above would refuse them too. The options schema lists
# them (llm_options.VLLM_ONLY_FIELDS: vLLM's keys, vllm/config/speculative.py).
NOT_TRTLLM_NESTED: dict[str, frozenset[str]] = {"speculative_config": VLLM_ONLY_FIELDS}
# Where the installed classes live (tensorrt_llm.llmapi exports all four).
_INSTALLED_CLASSES = {
    None: "TorchLlmArgs",
    "speculative_config": "Eagle3DecodingConfig",
    "kv_cache_config": "KvCacheConfig",
    "cuda_graph_config": "CudaGraphConfig",
}


@dataclass(frozen=True)
class NameTable:
    top: frozenset[str]
    nested: dict[str, frozenset[str]]
    source: str  # "installed TensorRT-LLM X" or "documented table"


def documented_names() -> NameTable:
    return NameTable(DOCUMENTED_TOP_LEVEL, dict(DOCUMENTED_NESTED), "documented table (TensorRT-LLM 1.2.x to 1.4)")


def _field_names(model_cls: Any) -> frozenset[str]:
    """Field names plus every accepted alias of a pydantic model class."""
    names: set[str] = set()
    for name, info in model_cls.model_fields.items():
        names.add(name)
        for alias in (getattr(info, "alias", None), getattr(info, "validation_alias", None)):
            if isinstance(alias, str):
                names.add(alias)
            elif alias is not None and hasattr(alias, "choices"):  # AliasChoices
                names.update(c for c in alias.choices if isinstance(c, str))
    return frozenset(names)


@functools.lru_cache(maxsize=1)
def installed_names() -> NameTable | None:
    """Names from the importable TensorRT-LLM, or None when it is absent or cannot import.

    Importing tensorrt_llm needs a GPU driver (libcuda) and takes seconds, so this runs only
    when its package is installed; an import failure falls back to the documented table.
    """
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        import tensorrt_llm.llmapi as llmapi  # local: optional and heavy (GPU machines only)
    except Exception:
        return None
    try:
        from tensorrt_llm.llmapi.llm_args import TorchLlmArgs  # local: where the field list lives in newer releases
    except ImportError:
        TorchLlmArgs = getattr(llmapi, "TorchLlmArgs", None)
    if TorchLlmArgs is None:
        return None
    nested = {}
    for key, cls_name in _INSTALLED_CLASSES.items():
        if key is None:
            continue
        cls = getattr(llmapi, cls_name, None)
        if cls is not None and hasattr(cls, "model_fields"):
            nested[key] = _field_names(cls)
    return NameTable(_field_names(TorchLlmArgs), nested, f"installed TensorRT-LLM {installed_version() or '?'}")


def check_names(kwargs: dict[str, Any], table: NameTable, where: str = OPTIONS_FILE) -> None:
    """Refuse option names the table does not know, naming each with its closest known name."""
    unknown: list[str] = []
    for key, value in kwargs.items():
        if key not in table.top:
            unknown.append(_with_suggestion(key, table.top))
            continue
        sub = table.nested.get(key)
        if sub is not None and isinstance(value, dict):
            unknown.extend(_with_suggestion(f"{key}.{k}", sub, prefix=f"{key}.") for k in value if k not in sub)
    if unknown:
        raise UserError(
            where,
            f"unknown TensorRT-LLM option(s): {', '.join(unknown)} (checked against the {table.source})",
            "fix the name, or remove it; options differ between TensorRT-LLM releases (tensorrt_llm/llmapi/llm_args.py)",
        )


def _with_suggestion(name: str, known: frozenset[str], prefix: str = "") -> str:
    leaf = name[len(prefix) :] if prefix else name
    close = difflib.get_close_matches(leaf, sorted(known), n=1, cutoff=0.75)
    return f"{name} (did you mean {prefix}{close[0]}?)" if close else name
