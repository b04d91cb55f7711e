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


def iteration_seconds(verify_s: float, draft_forward_s: Callable[[float], float], batch: int, k: int, topk: int) -> float:
    it = verify_s + draft_forward_s(batch * (k + 1))
    it += sum(draft_forward_s(batch * i * topk) for i in range(1, k))
    return it
