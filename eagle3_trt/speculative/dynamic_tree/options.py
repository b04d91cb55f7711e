"""The dynamic tree's options rules as a bundle's ``speculative_config`` is validated
(pipeline/llm_options.py ``Eagle3Options``, whose fields mirror TensorRT-LLM's flat
``Eagle3DecodingConfig``: use_dynamic_tree, dynamic_tree_max_topK, max_total_draft_tokens)."""

from __future__ import annotations

from collections.abc import Mapping


def check_dynamic_tree_options(
    use_dynamic_tree: bool | None,
    topk: int | None,
    total: int | None,
    max_draft_len: int,
    has_sa_config: bool,
    draft_len_schedule: Mapping[int, int] | None,
) -> None:
    """TensorRT-LLM's rules (tensorrt_llm/llmapi/llm_args.py @00043967 validate_eagle_config; the
    dynamic-tree worker, tensorrt_llm/_torch/speculative/eagle3_dynamic_tree.py @057c8a65); a
    ValueError (pydantic reports it with the field) for what they refuse."""
    if not use_dynamic_tree:
        if topk is not None or total is not None:
            # newer releases ignore a lone dynamic_tree_max_topK, older ones turned the tree on with it
            raise ValueError("dynamic_tree_max_topK / max_total_draft_tokens need use_dynamic_tree: true (or drop them)")
        return
    if topk is None:
        raise ValueError("use_dynamic_tree needs dynamic_tree_max_topK (TensorRT-LLM has no default)")
    top = topk * max_draft_len
    if total is not None and not max_draft_len <= total <= top:
        raise ValueError(f"max_total_draft_tokens {total} must be in [max_draft_len {max_draft_len}, dynamic_tree_max_topK * max_draft_len {top}]")
    if has_sa_config:
        raise ValueError("use_dynamic_tree does not go with sa_config (TensorRT-LLM's dynamic tree refuses the suffix-automaton enhancer)")
    # a tree keeps its draft length: TensorRT-LLM's dynamic draft length is for linear trees only
    # (attention backend trtllm.py: "Currently dynamic draft length is only supported for linear tree")
    if draft_len_schedule and any(v not in (0, max_draft_len) for v in draft_len_schedule.values()):
        raise ValueError("with use_dynamic_tree, draft_len_schedule may only switch speculation off (values max_draft_len or 0)")
