"""TensorRT-LLM's EAGLE-3 dynamic tree (``use_dynamic_tree``, ``dynamic_tree_max_topK``,
``max_total_draft_tokens``): a tree built per step and per row from the draft's probabilities."""

from __future__ import annotations

from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod

__all__ = ["DynamicTreeMethod"]
