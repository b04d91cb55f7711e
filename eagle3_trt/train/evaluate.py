"""Held-out acceptance of a draft head, measured by real greedy speculative decoding.

The decoding is the runtime's own loop (``core.engine.SpeculativeEngine``: TensorRT-LLM's
one-model EAGLE-3 with greedy sampling, a linear chain of K drafts verified by one target pass),
so the figure is the speed-up the head buys when served, not an estimate from teacher forcing.
Its output equals plain greedy decoding of the target; tests/test_engine_cross_check.py checks
the engine's accept lengths against an independent re-derivation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch

from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.core.stats import aggregate
from eagle3_trt.core.target import TargetModel


@dataclass
class AcceptanceReport:
    max_draft_len: int
    prompts: int
    tokens: int  # generated tokens
    iterations: int  # verification passes that checked drafts
    acceptance_length: float  # generated tokens per target forward, prefill included (1 = no gain)
    per_step: list[float]  # P(draft k accepted | drafts < k accepted)
    accepted_hist: list[int] = field(default_factory=list)  # iterations by number of accepted drafts

    def to_dict(self) -> dict:
        return asdict(self)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op threads. Batch-1 decoding on a CPU gains nothing from
    more than one thread, and on a shared machine spinning workers make each tiny GEMM ~1000x
    slower (measured: 12 ms vs 11 us for a 4x64x192 Linear with 2 threads on a busy 2-core box)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def measure_acceptance(
    target: TargetModel,
    draft: Eagle3Draft,
    prompts: list[list[int]],
    max_new_tokens: int,
    max_draft_len: int,
    stop_ids: tuple[int, ...] = (),
    on_prompt: Callable[[int], None] | None = None,
    engine_kwargs: dict | None = None,
) -> AcceptanceReport:
    """Greedy speculative decoding of each prompt (one request at a time, as a single user sees it).
    ``engine_kwargs``: what a method's head drafts with (its ``training.engine_kwargs``: method, embedding)."""
    engine = SpeculativeEngine(target, draft, None, max_draft_len=max_draft_len, eos_token_ids=stop_ids, **(engine_kwargs or {}))
    params = SamplingParams(max_tokens=max_new_tokens)
    stats = []
    on_cpu = draft.fc.weight.device.type == "cpu"
    with torch_threads(1 if on_cpu else None):
        for i, pr in enumerate(prompts):
            stats.append(engine.generate([pr], params)[0].stats)
            if on_prompt:
                on_prompt(i + 1)
    agg = aggregate(stats)
    hist = (agg.accept_hist + [0] * (max_draft_len + 1))[: max_draft_len + 1]
    per_step = (agg.conditional_acceptance + [0.0] * max_draft_len)[:max_draft_len]
    # generated tokens per target forward, the prefill (which yields the first token) included,
    # as core.stats counts it: K = 0 gives exactly 1
    al = agg.acceptance_length if prompts else 1.0
    return AcceptanceReport(
        max_draft_len=max_draft_len,
        prompts=len(prompts),
        tokens=agg.generated_tokens,
        iterations=sum(hist),
        acceptance_length=round(al, 4),
        per_step=[round(x, 4) for x in per_step],
        accepted_hist=hist,
    )


def greedy_generate(
    target: TargetModel,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
    batch_size: int = 16,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """The target's plain greedy continuations (left-padded batches through the runtime's loop
    with K = 0); each ends at (and includes) its first stop token."""
    engine = SpeculativeEngine(target, None, None, eos_token_ids=stop_ids, pad_token_id=pad_id)
    params = SamplingParams(max_tokens=max_new_tokens)
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        out += [r.token_ids for r in engine.generate(chunk, params, speculate=False)]
        if on_batch:
            on_batch(len(chunk))
    return out
