"""Sampling parameters and the logits processing shared by drafting, verification and plain decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3_trt.errors import UserError


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # the engine adds the tokenizer / generation_config eos ids itself

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise UserError("max_tokens", f"{self.max_tokens} is negative", "ask for 1 or more tokens")
        if self.temperature < 0:
            raise UserError("temperature", f"{self.temperature} is negative", "use 0 for greedy decoding")
        if not 0 < self.top_p <= 1:
            raise UserError("top_p", f"{self.top_p} is outside (0, 1]", "use 1.0 to disable nucleus sampling")
        if self.top_k < 0:
            raise UserError("top_k", f"{self.top_k} is negative", "use 0 to disable top-k")
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def process_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities after temperature, then top-k, then top-p (the order of HF's warpers)."""
    x = logits.float() / temperature
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sx, idx = torch.sort(x, dim=-1, descending=True)
        sp = torch.softmax(sx, dim=-1)
        before = torch.cumsum(sp, dim=-1) - sp  # mass of strictly more likely tokens
        drop = before >= top_p
        drop[..., 0] = False
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, idx, drop), float("-inf"))
    return torch.softmax(x, dim=-1)


def sample_token(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    if params.greedy:
        return int(torch.argmax(logits))
    p = process_logits(logits, params.temperature, params.top_k, params.top_p)
    return int(torch.multinomial(p, 1, generator=gen))
