"""The cost model's P-EAGLE hook: what one speculative iteration costs.

The EAGLE-3 chain (measure/cost_model.py ``predict``) runs K draft forwards per iteration: one over
the newly verified tokens (E_K per sequence on average) and K-1 over one token each. P-EAGLE runs ONE
draft forward (vLLM's proposer returns after it: ``if self.num_speculative_tokens == 1 or
self.parallel_drafting``, llm_base_proposer.py @ 00c4f22dae4795e34658bead82fa071e6bb7ae39) over the
verified tokens, the bonus token and the K-1 mask slots: E_K + K - 1 tokens per sequence. The
verification forward is the chain's (one target forward over K+1 tokens per sequence).

Memory-bound (small batches) a draft forward costs about the same over 1 or E+K-1 tokens, so P-EAGLE
saves K-1 draft forwards per iteration; compute-bound (large batches) it saves little, and whether it
wins then depends on its acceptance against EAGLE-3's: the comparison this toolkit measures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def draft_seconds(draft_forward_s: Callable[[float], float], batch: int, expected_tokens: float, k: int) -> float:
    """Draft time of one P-EAGLE iteration. ``draft_forward_s(tokens)``: seconds of one draft forward over
    that many tokens (the batch's KV read included); ``expected_tokens``: E_K per sequence."""
    return draft_forward_s(batch * (expected_tokens + k - 1))


def iteration_seconds(verify_s: float, draft_forward_s: Callable[[float], float], batch: int, expected_tokens: float, k: int) -> float:
    """One P-EAGLE iteration: the verification forward plus its one draft forward."""
    return verify_s + draft_seconds(draft_forward_s, batch, expected_tokens, k)


def speedup(base_s: float, verify_s: float, draft_forward_s: Callable[[float], float], batch: int, expected_tokens: float, k: int) -> float:
    """Predicted speedup over no speculation: E_K target-only steps per P-EAGLE iteration."""
    return expected_tokens * base_s / iteration_seconds(verify_s, draft_forward_s, batch, expected_tokens, k)


def step_seconds(
    target_forward_s: Callable[[float], float], draft_forward_s: Callable[[float], float], batch: int, expected_tokens: float, k: int, options: Any = None
) -> float:
    """The registry's cost hook (``registry.step_cost``; signature as speculative/eagle3/cost.py's): the
    chain's verification of K + 1 tokens per sequence plus ONE draft forward for all K tokens."""
    return iteration_seconds(target_forward_s(batch * (k + 1)), draft_forward_s, batch, expected_tokens, k)
