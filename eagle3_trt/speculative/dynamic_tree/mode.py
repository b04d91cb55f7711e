"""``alpha --modes dynamic-tree``: TensorRT-LLM's EAGLE-3 dynamic tree (speculative/dynamic_tree/builder.py) as a
measurement hook: the speculation mode to measure beside the chain, with the checks that refuse it before a model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.speculative.dynamic_tree.rules import DynamicTreeConfig, check_dynamic_tree, check_target

DYNAMIC_TREE_MODE = "dynamic-tree"
# TensorRT-LLM has no default dynamic_tree_max_topK (it is required with use_dynamic_tree); 10 is the
# value of its docs' example (docs/source/features/speculative-decoding.md @04c8822c). The default
# max_total_draft_tokens is TensorRT-LLM's own: dynamic_tree_max_topK * max_draft_len.
DEFAULT_TOPK = 10


def refuse_combined_modes(modes: tuple[str, ...]) -> None:
    """A mode written as a combination ("dynamic-tree+sa"): TensorRT-LLM refuses the dynamic tree
    with sa_config (eagle3_dynamic_tree.py @057c8a65, Eagle3OneModelDynamicTreeWorker.__init__)."""
    for m in modes:
        parts = set(m.split("+"))
        if len(parts) > 1 and parts == {DYNAMIC_TREE_MODE, "sa"}:
            raise UserError(
                "--modes",
                f"{m}: TensorRT-LLM's dynamic tree does not support the suffix-automaton enhancer (sa_config)",
                "measure dynamic-tree and sa as separate modes: --modes chain,sa,dynamic-tree",
            )


def dynamic_tree_for_modes(
    modes: tuple[str, ...], target_config: Any, target_config_path: Path, k: int, topk: int, total: int | None, temperature: float
) -> DynamicTreeConfig | None:
    """The dynamic tree to measure (None when the mode is not asked for), or the one-line reason it
    cannot run: out-of-range topK / max_total_draft_tokens, a sliding-window or MLA target."""
    if DYNAMIC_TREE_MODE not in modes:
        return None
    check_dynamic_tree(topk, total, k, names=("--dynamic-tree-topk", "--max-total-draft-tokens"))
    check_target(target_config, where=str(target_config_path))
    # temperature > 0 is measured as TensorRT-LLM samples its tree (core/verify.py ``_walk``)
    return DynamicTreeConfig(topk, total)


def dynamic_tree_entry(cfg: DynamicTreeConfig, k: int) -> dict[str, Any]:
    """What the mode entry records of the tree it measured, in TensorRT-LLM's names."""
    return {"use_dynamic_tree": True, "dynamic_tree_max_topK": cfg.topk, "max_total_draft_tokens": cfg.total(k), "max_draft_len": k}
