"""The EAGLE-3 chain's cost-model hook: the time of one speculative iteration, from the forward
times the cost model's roofline gives (measure/cost_model.py ``forward_time_s``).

TensorRT-LLM's one-model EAGLE-3 (tensorrt_llm/_torch/speculative/eagle3.py, ``Eagle3OneModelWorker``):
one target forward verifies K + 1 tokens per sequence; draft step 1 runs over the newly accepted
tokens (E_K per sequence on average), steps 2..K over one token per sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def iteration_seconds(verify_s: float, draft_forward_s: Callable[[float], float], batch: int, expected_tokens: float, k: int) -> float:
    """``verify_s``: the target forward over batch * (K + 1) tokens; ``draft_forward_s(tokens)``: one
    draft forward over that many tokens."""
    return verify_s + draft_forward_s(batch * expected_tokens) + (k - 1) * draft_forward_s(batch)


def step_seconds(
    target_forward_s: Callable[[float], float], draft_forward_s: Callable[[float], float], batch: int, expected_tokens: float, k: int, options: Any = None
) -> float:
    """The registry's cost hook (``registry.step_cost``), the same signature for every method:
    ``target_forward_s(tokens)`` / ``draft_forward_s(tokens)``: one forward over that many tokens of
    the batch. The chain verifies K + 1 tokens per sequence; ``options`` are not read."""
    return iteration_seconds(target_forward_s(batch * (k + 1)), draft_forward_s, batch, expected_tokens, k)
