"""The reduced draft vocabulary: the target ids a head can propose, chosen by token frequency.

TensorRT-LLM maps a draft id to a target id as ``target_id = draft_id + d2t[draft_id]``;
``t2d`` (bool over the target vocabulary) marks the kept ids. Kept ids are stored sorted, so
d2t is non-decreasing and draft id order follows target id order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftVocab:
    target_ids: torch.Tensor  # int64 [D], sorted: draft id -> target id
    vocab_size: int

    @property
    def size(self) -> int:
        return int(self.target_ids.numel())

    @property
    def full(self) -> bool:
        return self.size == self.vocab_size

    def d2t(self) -> torch.Tensor:
        return self.target_ids - torch.arange(self.size, dtype=torch.int64)

    def t2d(self) -> torch.Tensor:
        m = torch.zeros(self.vocab_size, dtype=torch.bool)
        m[self.target_ids] = True
        return m

    def target_to_draft(self) -> torch.Tensor:
        """int64 [V]: draft id of each target id, -1 where the draft cannot propose it."""
        out = torch.full((self.vocab_size,), -1, dtype=torch.int64)
        out[self.target_ids] = torch.arange(self.size, dtype=torch.int64)
        return out

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, vocab_size: int) -> DraftVocab:
        d2t = d2t.to(torch.int64)
        return cls(target_ids=torch.arange(d2t.numel(), dtype=torch.int64) + d2t, vocab_size=vocab_size)


def count_tokens(sequences: Iterable[list[int]]) -> Counter:
    c: Counter = Counter()
    for ids in sequences:
        c.update(ids)
    return c


def build_draft_vocab(counts: Counter, vocab_size: int, draft_vocab_size: int, always: Iterable[int] = ()) -> DraftVocab:
    """Keep `always` (special tokens) first, then the most frequent ids, then the lowest unseen ids
    so the size is exact; ties broken by id so the result is deterministic."""
    draft_vocab_size = min(draft_vocab_size, vocab_size)
    ranked = sorted(range(vocab_size), key=lambda i: (-counts.get(i, 0), i))
    keep = list(dict.fromkeys([i for i in always if 0 <= i < vocab_size] + ranked))[:draft_vocab_size]
    return DraftVocab(target_ids=torch.tensor(sorted(keep), dtype=torch.int64), vocab_size=vocab_size)


def coverage(counts: Counter, vocab: DraftVocab) -> float:
    """Fraction of counted tokens the draft vocabulary can propose."""
    total = sum(counts.values())
    if not total:
        return 0.0
    kept = set(vocab.target_ids.tolist())
    return sum(n for i, n in counts.items() if i in kept) / total
