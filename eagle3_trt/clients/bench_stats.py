"""Per-request records of the rollout benchmark and what is computed from them: per-arm statistics
(percentiles, alpha, AL) and the greedy identity of the texts with speculation on vs off."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from eagle3_trt.clients.llm_client import Timed

# Below this many samples a p99 is the largest value or next to it: one outlier sets it.
MIN_P99_SAMPLES = 100


# ---- statistics ------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class RequestRecord(Timed):
    concurrency: int
    speculative: bool
    prompt_index: int
    ok: bool
    error: str | None = None
    t_send: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    n_tokens: int = 0
    finish_reason: str | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    acceptance_length: float | None = None  # engine definition: tokens per target forward, prefill included
    request_index: int = -1  # i-th request of its level and arm: the same prompt in both arms
    text: str = ""
    served_speculative: bool | None = None  # the server's speculative_decoding output (None: not reported)

    def itl_samples(self) -> list[float]:
        """Per-token inter-token latencies (seconds), one per token after the first response."""
        out: list[float] = []
        for i in range(1, len(self.chunk_times)):
            n = self.chunk_tokens[i]
            if n > 0:
                out += [(self.chunk_times[i] - self.chunk_times[i - 1]) / n] * n
        return out


@dataclass
class ArmResult:
    concurrency: int
    speculative: bool
    requests: int
    errors: int
    wall_s: float
    output_tokens: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    output_tokens_per_s: float
    alpha_responses: float | None
    al_responses: float | None
    alpha_metrics: float | None = None
    al_metrics: float | None = None
    acceptance_by_position: list[float] = field(default_factory=list)
    drafted_by_position: list[float] = field(default_factory=list)
    ttft_samples: int = 0
    itl_samples: int = 0
    latency_samples: int = 0
    served_without_speculation: int = 0  # requests of a speculation-on arm the server ran without it

    def thin_p99(self) -> list[str]:
        """The p99s that rest on fewer than MIN_P99_SAMPLES samples."""
        return [
            f"{name} p99 from {n} samples"
            for name, n in (("TTFT", self.ttft_samples), ("ITL", self.itl_samples), ("latency", self.latency_samples))
            if 0 < n < MIN_P99_SAMPLES
        ]

    @property
    def speculation_switched_off(self) -> bool:
        """A speculation-on arm that the server mostly served without the draft (e.g. above max_concurrency)."""
        return self.speculative and self.requests > self.errors and self.served_without_speculation * 2 > self.requests - self.errors


def summarize(records: list[RequestRecord], concurrency: int, speculative: bool, wall_s: float) -> ArmResult:
    ok = [r for r in records if r.ok]
    itl = [x for r in ok for x in r.itl_samples()]
    toks = sum(r.n_tokens for r in ok)
    draft = sum(r.draft_tokens or 0 for r in ok)
    acc = sum(r.accepted_tokens or 0 for r in ok)
    # AL per verification step from the per-request figures: target forwards = n / AL
    # (prefill included); the prefill forward yields one token and verifies nothing.
    steps = tok_v = 0.0
    for r in ok:
        if r.acceptance_length and r.n_tokens > 1:
            forwards = round(r.n_tokens / r.acceptance_length)
            if forwards > 1:
                steps += forwards - 1
                tok_v += r.n_tokens - 1
    return ArmResult(
        concurrency=concurrency,
        speculative=speculative,
        requests=len(records),
        errors=len(records) - len(ok),
        wall_s=wall_s,
        output_tokens=toks,
        ttft_p50_s=percentile([r.ttft_s for r in ok], 50),
        ttft_p99_s=percentile([r.ttft_s for r in ok], 99),
        itl_p50_s=percentile(itl, 50),
        itl_p99_s=percentile(itl, 99),
        latency_p50_s=percentile([r.latency_s for r in ok], 50),
        latency_p99_s=percentile([r.latency_s for r in ok], 99),
        output_tokens_per_s=toks / wall_s if wall_s > 0 else 0.0,
        alpha_responses=(acc / draft) if (speculative and draft) else None,
        al_responses=(tok_v / steps) if (speculative and steps) else None,
        ttft_samples=len(ok),
        itl_samples=len(itl),
        latency_samples=len(ok),
        served_without_speculation=sum(1 for r in ok if speculative and r.served_speculative is False),
    )


# ---- greedy identity -----------------------------------------------------------------------------
def identity_check(records: list[RequestRecord], greedy: bool, examples: int = 5) -> dict:
    """Compare the text of request i with speculation on and off at each level (same prompt).

    Only meaningful for greedy sampling; sampled runs are reported as not checked."""
    if not greedy:
        return {"checked": False, "reason": "sampling is not greedy (--temperature set)", "compared": 0, "diverged": 0, "rate": None, "examples": []}
    on = {(r.concurrency, r.request_index): r for r in records if r.ok and r.speculative}
    off = {(r.concurrency, r.request_index): r for r in records if r.ok and not r.speculative}
    pairs = sorted(set(on) & set(off))
    diverged = []
    for key in pairs:
        a, b = on[key].text, off[key].text
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverged.append(
                {
                    "concurrency": key[0],
                    "request": key[1],
                    "prompt_index": on[key].prompt_index,
                    "first_difference_at_char": at,
                    "on": a[max(0, at - 20) : at + 40],
                    "off": b[max(0, at - 20) : at + 40],
                }
            )
    return {
        "checked": True,
        "compared": len(pairs),
        "diverged": len(diverged),
        "rate": (len(diverged) / len(pairs)) if pairs else None,
        "examples": diverged[:examples],
    }
