"""TensorRT-LLM's rules for the EAGLE-3 dynamic tree, without torch (the bundle schema and the
launchers read them too): the configuration, its ranges and the targets it refuses. The algorithm
is in speculative/dynamic_tree/builder.py.

Sources (NVIDIA/TensorRT-LLM): tensorrt_llm/llmapi/llm_args.py @00043967
(``EagleDecodingConfig.validate_eagle_config``); docs/source/features/speculative-decoding.md
@04c8822c ("Dynamic tree mode is currently not supported for models that use sliding window
attention or MLA (Multi-Latent Attention), such as DeepSeek and gpt-oss models").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eagle3_trt.errors import UserError

# the MLA families TensorRT-LLM runs (DeepSeek-V2/V3, Kimi-K2): config.json carries kv_lora_rank
MLA_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})


@dataclass(frozen=True)
class DynamicTreeConfig:
    """``Eagle3DecodingConfig.dynamic_tree_max_topK`` and ``max_total_draft_tokens`` (None:
    TensorRT-LLM's default, dynamic_tree_max_topK * max_draft_len)."""

    topk: int
    max_total_draft_tokens: int | None = None

    def total(self, max_draft_len: int) -> int:
        return check_dynamic_tree(self.topk, self.max_total_draft_tokens, max_draft_len)


def check_dynamic_tree(
    topk: int | None, total: int | None, max_draft_len: int, names: tuple[str, str] = ("dynamic_tree_max_topK", "max_total_draft_tokens")
) -> int:
    """TensorRT-LLM's ``validate_eagle_config`` for the dynamic tree (llm_args.py @00043967): topK >= 1
    is required, max_total_draft_tokens in [max_draft_len, topK * max_draft_len], default the upper
    end. Returns the resolved max_total_draft_tokens. ``names``: what to call the two in errors."""
    if max_draft_len < 1:
        raise UserError("max_draft_len", f"{max_draft_len}", "the dynamic tree needs max_draft_len >= 1 (its depth)")
    if topk is None or topk < 1:
        raise UserError(
            names[0],
            f"{topk!r}: the dynamic tree needs dynamic_tree_max_topK >= 1 (the nodes expanded per layer)",
            "set dynamic_tree_max_topK, e.g. 10 as in TensorRT-LLM's docs",
        )
    if total is None:
        return topk * max_draft_len
    if not max_draft_len <= total <= topk * max_draft_len:
        raise UserError(
            names[1],
            f"{total} must be in [max_draft_len ({max_draft_len}), dynamic_tree_max_topK * max_draft_len ({topk * max_draft_len})]",
            "TensorRT-LLM refuses other values (llm_args.py validate_eagle_config); leave it out for the default topK * max_draft_len",
        )
    return total


def dynamic_tree_refusal(config: Mapping[str, Any] | Any) -> str | None:
    """Why TensorRT-LLM's dynamic tree cannot run on this target (its config.json, a dict or an HF
    config object): sliding-window attention or MLA; None when it can."""

    def get(key: str) -> Any:
        return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)

    types = get("layer_types") or ()
    window = get("sliding_window")
    if window and ("sliding_attention" in types or get("use_sliding_window") is True or (not types and get("use_sliding_window") is None)):
        return f"the target uses sliding-window attention (sliding_window {window})"
    if get("kv_lora_rank") or get("model_type") in MLA_MODEL_TYPES:
        return "the target uses MLA (multi-latent attention)"
    return None


def check_target(config: Mapping[str, Any] | Any, where: str = "use_dynamic_tree") -> None:
    why = dynamic_tree_refusal(config)
    if why is not None:
        raise UserError(
            where,
            f"TensorRT-LLM's dynamic tree does not support this target: {why}",
            "use the chain (drop use_dynamic_tree); TensorRT-LLM documents no dynamic tree for sliding-window or MLA models",
        )
