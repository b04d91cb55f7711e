"""The dynamic tree's cost-model hook: the time of one iteration, from the forward times the cost
model's roofline gives (measure/cost_model.py ``forward_time_s``).

- target forward over batch * (N + 1) tokens (N = max_total_draft_tokens: the verification cost grows
  with the tokens verified), timed by the caller as ``verify_s``;
- draft step 0 over batch * (K + 1) tokens (TensorRT-LLM re-packs every request to max_draft_len + 1
  tokens, ``_gather_repack_step0_kernel``);
- draft layer i = 1..K-1 over batch * i * topK tokens (its draft loop re-runs every expanded node each
  layer, a growing context: ``_forward_draft_loop`` in tensorrt_llm/_torch/speculative/
  eagle3_dynamic_tree.py @057c8a65).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.speculative.dynamic_tree.rules import check_dynamic_tree


def iteration_seconds(verify_s: float, draft_forward_s: Callable[[float], float], batch: int, k: int, topk: int) -> float:
    it = verify_s + draft_forward_s(batch * (k + 1))
    it += sum(draft_forward_s(batch * i * topk) for i in range(1, k))
    return it


def step_seconds(
    target_forward_s: Callable[[float], float], draft_forward_s: Callable[[float], float], batch: int, expected_tokens: float, k: int, options: Any = None
) -> float:
    """The registry's cost hook (``registry.step_cost``; signature as speculative/eagle3/cost.py's): the
    tree's shape from the bundle's ``options`` (``dynamic_tree_max_topK``; ``max_total_draft_tokens`` at
    the options' own depth ``max_draft_len``, TensorRT-LLM's default topK * K at any other K, where the
    configured node count may be out of range: rules.check_dynamic_tree); the verification runs over
    the N + 1 tree tokens of each sequence. ``expected_tokens`` does not change the tree's cost."""
    topk = getattr(options, "dynamic_tree_max_topK", None)
    if topk is None:
        raise UserError("speculative_config", "the dynamic tree's cost needs dynamic_tree_max_topK", "measure a bundle that serves use_dynamic_tree")
    at_depth = getattr(options, "max_draft_len", None) == k
    n = check_dynamic_tree(int(topk), getattr(options, "max_total_draft_tokens", None) if at_depth else None, k)
    return iteration_seconds(target_forward_s(batch * (n + 1)), draft_forward_s, batch, k, int(topk))
