"""Per-request speculative-decoding statistics and their aggregation.

Accounting follows TensorRT-LLM's per-request perf metrics (``SpeculativeDecodingMetrics`` in
cpp/include/tensorrt_llm/executor/types.h, updated by ``LlmRequest`` in
cpp/include/tensorrt_llm/batch_manager/llmRequest.h): every iteration adds the number of draft
tokens proposed along the draft path (at most the longest draft path) to ``draft_tokens`` and the
number of them the target accepted (and that were emitted) to ``accepted_tokens``;
acceptanceRate = totalAcceptedDraftTokens / totalDraftTokens. Position k (0-based) is the
k-th draft token after the last accepted one:

- ``drafted_per_position[k]``: iterations that proposed a token at position k;
- ``reached_per_position[k]``: of those, iterations whose positions 0..k-1 were all accepted;
- ``accepted_per_position[k]``: iterations whose positions 0..k were all accepted.

So conditional acceptance at k = accepted[k] / reached[k] = P(k accepted | 0..k-1 accepted),
and cumulative acceptance at k = P(first k+1 accepted) = the product of the conditionals up to k.
(Not accepted[k] / drafted[k]: iterations near max_tokens draft fewer than K positions, so each
position would be estimated over a different set of iterations and the list need not decrease.
The product uses every iteration for every position it reached, is non-increasing by
construction, and equals accepted[k] / drafted[k] when every iteration drafted K.)
alpha = accepted_tokens / draft_tokens; acceptance length (AL) = generated tokens per target
forward, the prefill forward (which produces the first token) included, so K = 0 gives AL = 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


@dataclass
class RequestStats:
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_forwards: int = 0
    generated_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    arrival_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    speculation: bool = True
    reached_per_position: list[int] = field(default_factory=list)
    # accept_hist[a] = iterations (after the prefill) that accepted a draft tokens
    accept_hist: list[int] = field(default_factory=list)
    # draft tokens the target verified (tree nodes within the draft length; a chain: = draft_tokens)
    verified_tokens: int = 0
    # accepted_seq[i] = draft tokens accepted at the i-th verification, in order (the acceptance gate's
    # replay needs the order: core/speculation_control.py)
    accepted_seq: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return _ratio(self.accepted_tokens, self.draft_tokens)

    @property
    def acceptance_length(self) -> float:
        return _ratio(self.generated_tokens, self.target_forwards)

    @property
    def wall_time_s(self) -> float:
        return max(0, self.last_token_time_ns - self.arrival_time_ns) / 1e9

    def snapshot(self) -> RequestStats:
        """An independent copy (the runtime keeps updating its own)."""
        return replace(
            self,
            drafted_per_position=list(self.drafted_per_position),
            accepted_per_position=list(self.accepted_per_position),
            reached_per_position=list(self.reached_per_position),
            accept_hist=list(self.accept_hist),
            accepted_seq=list(self.accepted_seq),
        )

    def record_iteration(self, drafted: int, reached: int, accepted: int) -> None:
        """One verification: ``drafted`` positions proposed, positions 0..reached-1 offered in turn
        (reached = min(accepted + 1, drafted)), the first ``accepted`` of them accepted."""
        assert 0 <= accepted <= reached <= drafted
        for arr, n in ((self.drafted_per_position, drafted), (self.reached_per_position, reached), (self.accepted_per_position, accepted)):
            if len(arr) < drafted:  # the three lists stay aligned: index k = draft position k
                arr.extend([0] * (drafted - len(arr)))
            for k in range(n):
                arr[k] += 1
        if len(self.accept_hist) <= accepted:
            self.accept_hist.extend([0] * (accepted + 1 - len(self.accept_hist)))
        self.accept_hist[accepted] += 1
        self.accepted_seq.append(accepted)
        self.draft_tokens += drafted
        self.accepted_tokens += accepted

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, acceptance_length=self.acceptance_length, wall_time_s=self.wall_time_s)
        return d


@dataclass
class AggregateStats:
    """Sums over requests; per-position acceptance is pooled over iterations, not averaged per request."""

    requests: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_forwards: int = 0
    generated_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    reached_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    accept_hist: list[int] = field(default_factory=list)
    request_al: list[float] = field(default_factory=list)
    wall_time_s: float = 0.0
    verified_tokens: int = 0

    def add(self, s: RequestStats) -> None:
        self.requests += 1
        self.draft_tokens += s.draft_tokens
        self.accepted_tokens += s.accepted_tokens
        self.target_forwards += s.target_forwards
        self.generated_tokens += s.generated_tokens
        self.verified_tokens += s.verified_tokens
        for mine, theirs in (
            (self.drafted_per_position, s.drafted_per_position),
            (self.reached_per_position, s.reached_per_position),
            (self.accepted_per_position, s.accepted_per_position),
            (self.accept_hist, s.accept_hist),
        ):
            if len(mine) < len(theirs):
                mine.extend([0] * (len(theirs) - len(mine)))
            for k, v in enumerate(theirs):
                mine[k] += v
        self.request_al.append(s.acceptance_length)
        self.wall_time_s += s.wall_time_s

    @property
    def alpha(self) -> float:
        return _ratio(self.accepted_tokens, self.draft_tokens)

    @property
    def acceptance_length(self) -> float:
        return _ratio(self.generated_tokens, self.target_forwards)

    @property
    def cumulative_acceptance(self) -> list[float]:
        out, p = [], 1.0
        for c in self.conditional_acceptance:
            p *= c
            out.append(p)
        return out

    @property
    def conditional_acceptance(self) -> list[float]:
        return [_ratio(a, r) for a, r in zip(self.accepted_per_position, self.reached_per_position)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "alpha": self.alpha,
            "acceptance_length": self.acceptance_length,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "target_forwards": self.target_forwards,
            "generated_tokens": self.generated_tokens,
            "drafted_per_position": self.drafted_per_position,
            "reached_per_position": self.reached_per_position,
            "accepted_per_position": self.accepted_per_position,
            "cumulative_acceptance": self.cumulative_acceptance,
            "conditional_acceptance": self.conditional_acceptance,
            "accept_hist": self.accept_hist,
            "request_acceptance_length": self.request_al,
            "wall_time_s": self.wall_time_s,
        }


def aggregate(stats: Iterable[RequestStats]) -> AggregateStats:
    agg = AggregateStats()
    for s in stats:
        agg.add(s)
    return agg
