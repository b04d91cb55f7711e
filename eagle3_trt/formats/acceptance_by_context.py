"""The alpha report's ``acceptance_by_context`` section (measure/context_buckets.py ``context_tables``):
AL and alpha per bucket of context length at the verification, and per bucket of prompt length."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BucketRow(_Strict):
    """One bucket's decode forwards pooled (core/stats.py AggregateStats over them)."""

    bucket: str  # "0-512", "512-1k", ..., "4k+"
    mean_context: float
    requests: int
    forwards: int
    tokens: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_length: float  # tokens per decode forward (the prefill excluded)
    alpha: float
    cumulative_acceptance: list[float]


class BucketTableRecord(_Strict):
    edges: list[int]
    rows: list[BucketRow]  # buckets with at least one forward, in context order
    unmatched: list[str]  # requests whose verifications do not follow the chain's draft-length rule (left out)


class AcceptanceByContext(_Strict):
    k: int
    edges: list[int]
    max_tokens: int
    max_seq_len: int  # the draft-length rule near the context's end needs it to rebuild the steps
    al_counts: str
    by_context: BucketTableRecord
    by_prompt_length: BucketTableRecord


__all__ = ["AcceptanceByContext", "BucketRow", "BucketTableRecord"]
