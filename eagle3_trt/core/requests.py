"""Request bookkeeping of the engine: one row per request of a batch, the batch's KV caches with
per-row column validity, and what a step hands back to the caller."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from eagle3_trt.core.sampling import SEED_SPAN, SamplingParams, seeded_generator
from eagle3_trt.core.stats import RequestStats
from eagle3_trt.errors import UserError


@dataclass
class StepOutput:
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # 'stop' | 'length'
    stats: RequestStats


@dataclass
class RequestResult:
    token_ids: list[int]
    finish_reason: str | None
    stats: RequestStats


@dataclass
class Row:
    prompt: list[int]
    params: SamplingParams
    stats: RequestStats
    stop_ids: frozenset[int]
    gen: torch.Generator | None
    tokens: list[int] = field(default_factory=list)  # prompt + emitted
    finished: bool = False
    finish_reason: str | None = None
    root: int = -1  # last emitted token; not yet in the target cache
    # draft inputs not yet run through the draft: aux states of positions pend_pos.., next tokens
    pend_aux: torch.Tensor | None = None
    pend_tok: list[int] = field(default_factory=list)
    pend_pos: int = 0
    k_cap: int | None = None  # at most this many draft tokens per step for this row (None: the tree's depth)
    # K of the iteration that made this row's next drafts (its prefill or last decode): TensorRT-LLM drafts
    # inside that forward, so only that many are real when K rises (core/engine.py _pad_to_k); None: no cap
    drafts_k: int | None = None

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)


def new_rows(
    prompts: list[list[int]], params: SamplingParams, stop: frozenset[int], *, max_seq_len: int, vocab_size: int, device: torch.device, speculation: bool
) -> list[Row]:
    """One row per prompt, each checked against the model's limits; request i samples with seed + i."""
    now = time.time_ns()
    base_seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(6), "little")
    rows = []
    for i, p in enumerate(prompts):
        if not p:
            raise UserError("prompt", f"request {i} has no tokens", "send at least one prompt token")
        if len(p) >= max_seq_len:
            raise UserError(
                "prompt", f"request {i} has {len(p)} tokens; max_seq_len is {max_seq_len}", "shorten the prompt or rebuild with a larger max_seq_len"
            )
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise UserError("prompt", f"request {i} has token ids outside the vocabulary: {bad[:3]}", "tokenize with the bundle's tokenizer")
        gen = None
        if not params.greedy:
            gen = seeded_generator((base_seed + i) % SEED_SPAN, device)
        rows.append(
            Row(prompt=list(p), params=params, stats=RequestStats(arrival_time_ns=now, speculation=speculation), stop_ids=stop, gen=gen, tokens=list(p))
        )
    return rows


def emit(r: Row, toks: list[int], max_seq_len: int) -> list[int]:
    """Append tokens (truncated at the first stop token), update times and finish state."""
    out = []
    for t in toks:
        out.append(t)
        if t in r.stop_ids:
            r.finished, r.finish_reason = True, "stop"
            break
    r.tokens.extend(out)
    r.stats.generated_tokens += len(out)
    t = time.time_ns()
    if out:
        if not r.stats.first_token_time_ns:
            r.stats.first_token_time_ns = t
        r.stats.last_token_time_ns = t
    if not r.finished and (r.generated >= r.params.max_tokens or len(r.tokens) >= max_seq_len):
        r.finished, r.finish_reason = True, "length"
    if out:
        r.root = out[-1]
    if r.finished:
        r.pend_aux, r.pend_tok = None, []
    return out


class BatchState:
    """KV caches of one batch: target (HF DynamicCache) and draft (k, v), with per-row column validity."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.t_valid: torch.Tensor | None = None  # [B, C] bool
        self.d_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self.d_valid: torch.Tensor | None = None
        self.aux_sink: dict[int, list[torch.Tensor]] | None = None

    def append_target(self, new_valid: torch.Tensor) -> None:
        assert self.t_valid is not None  # set by _prefill
        self.t_valid = torch.cat([self.t_valid, new_valid], dim=1)
        used = self.t_valid.any(dim=0).nonzero()
        keep = int(used.max()) + 1 if used.numel() else 0
        if keep < self.t_valid.shape[1]:
            self.cache.crop(keep)
            self.t_valid = self.t_valid[:, :keep]
