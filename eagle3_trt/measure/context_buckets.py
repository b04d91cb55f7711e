"""Acceptance by context length: each verification of a measured request placed by how many tokens
the target had in its context then (prompt + tokens generated so far), and by the request's prompt length.

Why: acceptance falls with context in real deployments (speculators #684: AL 2.30 at 2k tokens,
1.09 at 16k; SGLang #6783: a head trained at 2k made decoding slower than none past 2k), so one
overall figure can hide the context beyond which speculation stops paying
(``measure/switch_off.py`` reads these tables).

The steps are rebuilt from what a report already holds per request (``prompt_tokens``,
``generated_tokens`` and ``accepted_seq``: the draft tokens accepted at each verification, in
order) with the decoding loop's own rule for how many tokens each iteration drafts
(``measure/estimator.walk_chain_batch``, which equals ``SpeculativeEngine.generate``):
the prefill emits the first token and drafts nothing; then each iteration, with g tokens
generated, drafts k = min(K, max_tokens - g - 1, max_seq_len - (prompt + g) - 1) tokens, accepts a
of them, and emits a + 1 (fewer at the end: a stop token ends the request without a bonus token,
and the last iteration emits only what the continuation still holds). An iteration that drafts
nothing (k = 0, at the very end) is a target forward that emits one token.

Figures per bucket are those of ``core.stats`` over the bucket's iterations only: alpha = accepted /
drafted, the per-position conditional and cumulative acceptance, and AL = tokens emitted per
decode forward. The prefill forward belongs to no bucket (it verifies nothing), so the "all" row's
AL is the decode AL, slightly above the report's overall AL (which counts the prefill forward).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from eagle3_trt.core.stats import AggregateStats, RequestStats, aggregate
from eagle3_trt.errors import UserError
from eagle3_trt.formats.acceptance_by_context import AcceptanceByContext
from eagle3_trt.formats.alpha_report import AlphaReport

# bucket edges in tokens of context: 0-512, 512-1k, 1k-2k, 2k-3k, 3k-4k (the embedded pair's context),
# then doubling to 128k+ (only buckets with verifications are reported)
DEFAULT_EDGES: tuple[int, ...] = (512, 1024, 2048, 3072, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass(frozen=True)
class Step:
    """One decode forward of a request: its context, what it drafted, accepted and emitted."""

    context: int  # tokens in the target's context: prompt + tokens generated before this forward
    drafted: int
    accepted: int
    reached: int  # draft positions offered in turn (core.stats.RequestStats.record_iteration)
    tokens: int  # tokens this forward emitted


def request_steps(prompt_tokens: int, generated_tokens: int, accepted_seq: Sequence[int], k: int, max_tokens: int, max_seq_len: int) -> list[Step] | None:
    """The decode forwards of one request (module docstring), or None when ``accepted_seq`` does not
    fit the loop's rule at this K (a tree's verifications, or a sequence recorded at another K)."""
    steps: list[Step] = []
    if generated_tokens <= 0:
        return [] if not accepted_seq else None
    g, i = 1, 0  # the prefill emitted the first token
    while g < generated_tokens:
        kk = max(0, min(k, max_tokens - g - 1, max_seq_len - (prompt_tokens + g) - 1))
        if kk > 0:
            if i >= len(accepted_seq):
                return None
            a = int(accepted_seq[i])
            i += 1
            if not 0 <= a <= kk:
                return None
        else:
            a = 0
        left = generated_tokens - g
        stopped = a > 0 and left == a  # a stop token among the accepted ends the request without a bonus token
        if a > left:
            return None
        reached = a if stopped else min(a + 1, kk)
        steps.append(Step(prompt_tokens + g, kk, a, reached, min(a + 1, left)))
        g += a + 1
    return steps if i == len(accepted_seq) else None


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """'0-512', '512-1k', ..., '4k+' for edges (512, 1024, ..., 4096)."""

    def short(n: int) -> str:
        return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)

    bounds = [0, *edges]
    return [f"{short(lo)}-{short(hi)}" for lo, hi in zip(bounds, bounds[1:])] + [f"{short(bounds[-1])}+"]


def bucket_of(context: int, edges: Sequence[int]) -> int:
    """Index of the bucket holding ``context`` tokens: bucket i covers [edges[i-1], edges[i])."""
    return bisect.bisect_right(list(edges), context)


def check_edges(edges: Sequence[int], where: str = "--context-buckets") -> tuple[int, ...]:
    out = tuple(int(e) for e in edges)
    if not out or any(e <= 0 for e in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise UserError(where, f"{list(edges)}", "use increasing positive token counts, e.g. 512,1024,2048,3072,4096")
    return out


@dataclass
class BucketTable:
    """Per bucket the pooled statistics of its decode forwards (``AggregateStats``; requests = the
    requests with at least one forward there), the mean context of those forwards, and the requests
    whose steps could not be rebuilt."""

    edges: tuple[int, ...]
    buckets: list[AggregateStats]
    mean_context: list[float]
    unmatched: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        rows = []
        for label, a, ctx in zip(bucket_labels(self.edges), self.buckets, self.mean_context):
            if a.target_forwards:
                rows.append(
                    {
                        "bucket": label,
                        "mean_context": round(ctx, 1),
                        "requests": a.requests,
                        "forwards": a.target_forwards,
                        "tokens": a.generated_tokens,
                        "draft_tokens": a.draft_tokens,
                        "accepted_tokens": a.accepted_tokens,
                        "acceptance_length": a.acceptance_length,
                        "alpha": a.alpha,
                        "cumulative_acceptance": a.cumulative_acceptance,
                    }
                )
        return {"edges": list(self.edges), "rows": rows, "unmatched": self.unmatched}


def _table(per_request: Iterable[tuple[list[Step], int]], edges: tuple[int, ...], key) -> BucketTable:
    n = len(edges) + 1
    stats: list[list[RequestStats]] = [[] for _ in range(n)]
    ctx_sum = [0.0] * n
    for steps, prompt in per_request:
        mine: dict[int, RequestStats] = {}
        for s in steps:
            b = key(s, prompt)
            st = mine.setdefault(b, RequestStats())
            if s.drafted:
                st.record_iteration(s.drafted, s.reached, s.accepted)
            st.target_forwards += 1
            st.generated_tokens += s.tokens
            ctx_sum[b] += s.context
        for b, st in mine.items():
            stats[b].append(st)
    aggs = [aggregate(s) for s in stats]
    return BucketTable(edges, aggs, [c / a.target_forwards if a.target_forwards else 0.0 for c, a in zip(ctx_sum, aggs)])


def context_table(per_request: Iterable[tuple[list[Step], int]], edges: tuple[int, ...]) -> BucketTable:
    """The table by context of rebuilt steps (``all_steps``)."""
    return _table(per_request, edges, lambda s, p: bucket_of(s.context, edges))


def context_tables(requests: Sequence[dict], k: int, max_tokens: int, max_seq_len: int, edges: Sequence[int] = DEFAULT_EDGES) -> dict:
    """``{"by_context": ..., "by_prompt_length": ...}`` (``BucketTable.to_dict``) over the report's
    request dicts (``TurnResult.to_dict``: prompt_tokens, generated_tokens, accepted_seq at K, or
    accepted_seq_by_k[K])."""
    edges = check_edges(edges)
    rebuilt, unmatched = all_steps(requests, k, max_tokens, max_seq_len)
    by_ctx = context_table(rebuilt, edges)
    by_prompt = _table(rebuilt, edges, lambda s, p: bucket_of(p, edges))
    by_ctx.unmatched = by_prompt.unmatched = unmatched
    return {
        "k": k,
        "edges": list(edges),
        "max_tokens": max_tokens,
        "max_seq_len": max_seq_len,
        "al_counts": "tokens emitted per decode forward (the prefill forward excluded)",
        "by_context": by_ctx.to_dict(),
        "by_prompt_length": by_prompt.to_dict(),
    }


def context_table_rich(ctx: AcceptanceByContext, title: str) -> Table:
    """One table of ``context_tables``'s result (``title``: "by_context" or "by_prompt_length")."""
    what = {"by_context": "tokens of context at the verification", "by_prompt_length": "prompt length"}[title]
    t = Table(title=f"acceptance by {what} (K={ctx.k}; AL = tokens per decode forward, the prefill excluded)")
    for c in ("bucket", "mean context", "requests", "forwards", "AL", "alpha"):
        t.add_column(c, justify="left" if c == "bucket" else "right")
    table = ctx.by_context if title == "by_context" else ctx.by_prompt_length
    for r in table.rows:
        t.add_row(r.bucket, f"{r.mean_context:.0f}", str(r.requests), str(r.forwards), f"{r.acceptance_length:.2f}", f"{r.alpha:.3f}")
    return t


def render_context_tables(report: AlphaReport, con: Console) -> None:
    """The two tables of an alpha report's ``acceptance_by_context`` (nothing when it has none), and
    the requests whose verifications could not be placed."""
    ctx = report.acceptance_by_context
    if ctx is None:
        return
    con.print(context_table_rich(ctx, "by_context"))
    con.print(context_table_rich(ctx, "by_prompt_length"))
    n = len(ctx.by_context.unmatched)
    if n:
        con.print(f"note: {n} requests' verifications do not follow the chain's draft-length rule at K={ctx.k} (left out of these tables)", highlight=False)


def accepted_at(request: dict, k: int, run_k: int | None) -> list[int] | None:
    """A request's per-verification accepted counts at K: its swept sequence, else its own at the run's K."""
    seq = (request.get("accepted_seq_by_k") or {}).get(str(k))
    if seq is None and run_k == k:
        seq = request.get("accepted_seq")
    return None if seq is None else [int(a) for a in seq]


def all_steps(requests: Sequence[dict], k: int, max_tokens: int, max_seq_len: int, run_k: int | None = None) -> tuple[list[tuple[list[Step], int]], list[str]]:
    """Each request's (steps, prompt tokens), and the ids of those whose steps do not fit the rule."""
    out: list[tuple[list[Step], int]] = []
    unmatched: list[str] = []
    for r in requests:
        seq = accepted_at(r, k, k if run_k is None else run_k)
        steps = None if seq is None else request_steps(int(r["prompt_tokens"]), int(r["generated_tokens"]), seq, k, max_tokens, max_seq_len)
        if steps is None:
            unmatched.append(f"{r.get('id')} turn {r.get('turn')}")
            continue
        out.append((steps, int(r["prompt_tokens"])))
    return out, unmatched


__all__ = [
    "DEFAULT_EDGES",
    "BucketTable",
    "Step",
    "all_steps",
    "bucket_labels",
    "bucket_of",
    "check_edges",
    "context_table",
    "context_table_rich",
    "context_tables",
    "render_context_tables",
    "request_steps",
]
