"""Sampling parameters and the logits processing shared by drafting, verification and plain decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3_trt.errors import UserError

# TensorRT-LLM's seed is a uint64 (the executor's SamplingConfig randomSeed): every value in [0, 2**64) is its own seed.
SEED_SPAN = 2**64
_MT_N = 624
# torch's CPU generator state (CPUGeneratorImplState): the_initial_seed (u64), left (i32), seeded (i32),
# next (u64), then mt19937's 624 state words, one u64 each.
_MT_WORDS_AT = 24


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
        if self.seed is not None and not 0 <= self.seed < SEED_SPAN:
            raise UserError("seed", f"{self.seed} is out of range", f"TensorRT-LLM's seed is a 64-bit unsigned integer: 0 to {SEED_SPAN - 1}")
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


def seeded_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator for ``seed`` that honours all 64 bits.

    CUDA's Philox generator takes the whole 64-bit seed, but torch's CPU mt19937 keeps only its low 32 bits
    (seeds 1, 2**32 + 1 and 2**40 + 1 drew identical samples). For a seed of 2**32 or more the CPU state is
    set from both halves with mt19937's reference ``init_by_array([low, high])``, so distinct seeds give
    distinct streams; seeds below 2**32 keep ``manual_seed``'s stream."""
    if not 0 <= seed < SEED_SPAN:
        raise UserError("seed", f"{seed} is out of range", f"TensorRT-LLM's seed is a 64-bit unsigned integer: 0 to {SEED_SPAN - 1}")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    if seed < 2**32 or gen.device.type != "cpu":
        return gen
    state = gen.get_state().clone()
    words = state[_MT_WORDS_AT : _MT_WORDS_AT + 8 * _MT_N].view(torch.int64)
    if int(words[0]) != seed & 0xFFFFFFFF:  # the layout above changed: refuse rather than seed silently wrong
        raise RuntimeError("torch's CPU generator state layout is not the one core/sampling.seeded_generator writes")
    words.copy_(torch.tensor(_mt_init_by_array([seed & 0xFFFFFFFF, seed >> 32]), dtype=torch.int64))
    gen.set_state(state)
    return gen


def _mt_init_by_array(key: list[int]) -> list[int]:
    """mt19937's reference ``init_by_array`` (Matsumoto and Nishimura, mt19937ar.c): the 624 state words."""
    m = 0xFFFFFFFF
    mt = [19650218]
    for i in range(1, _MT_N):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & m)
    i, j = 1, 0
    for _ in range(max(_MT_N, len(key))):
        mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525)) + key[j] + j) & m
        i, j = i + 1, j + 1
        if i >= _MT_N:
            mt[0], i = mt[_MT_N - 1], 1
        if j >= len(key):
            j = 0
    for _ in range(_MT_N - 1):
        mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941)) - i) & m
        i += 1
        if i >= _MT_N:
            mt[0], i = mt[_MT_N - 1], 1
    mt[0] = 0x80000000
    return mt
