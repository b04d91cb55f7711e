"""Captured traffic -> what the reference runtime measures offline (``alpha --traffic``, ``gate --traffic``).

Each record is measured on exactly the token ids the model saw (``prompt_ids``: a chat request
was templated by the server already, so it is never templated again) with its own sampling:

- greedy requests (``is_greedy``: temperature 0, top_k 1 or top_p 0) through the
  estimator, which gives the counts speculative generation gives; the cap is the served
  ``max_tokens``, except for a request the server cut at a stop string (finished "stop" short of
  the cap without an EOS id), measured up to the served length: the forwards that produced those
  tokens are the same ones, so its acceptance length is comparable exactly;
- sampled requests by speculative generation with the request's temperature / top-p / top-k /
  seed and served cap (a seeded request on the same engine may even repeat itself; the
  comparison only assumes the same distribution).

Records that cannot be compared are skipped with the reason: not finished (cancelled, error),
speculation switched off for the request, a prompt past the bundle's max_seq_len.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.core.stats import RequestStats
from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import TrafficRecord
from eagle3_trt.formats.traffic_split import group_prompts
from eagle3_trt.measure.estimator import estimate
from eagle3_trt.runtime.llm_api import implies_greedy

FINISHED = ("stop", "length")


def is_greedy(rec: TrafficRecord) -> bool:
    """Served greedily, by the runtime's one rule (llm_api.implies_greedy; unset values are captured
    as 0.0 / 1.0 / 0, so "none given" reads as temperature 0)."""
    s = rec.sampling
    return implies_greedy(s.temperature, s.top_k, s.top_p)


@dataclass
class TrafficItem:
    """One captured request and its offline measurement (``stats`` None until measured)."""

    record: TrafficRecord
    max_tokens: int
    greedy: bool
    stats: RequestStats | None = None
    output_ids: list[int] = field(default_factory=list)
    stats_by_k: dict[int, RequestStats] = field(default_factory=dict)

    @property
    def served_tokens(self) -> int:
        return self.record.acceptance.completion_tokens

    @property
    def served_forwards(self) -> int:
        return self.record.acceptance.target_forwards

    def identical(self) -> bool:
        """Offline tokens, forwards and output equal the served ones (what a greedy request must give)."""
        s = self.stats
        return (
            s is not None
            and (s.generated_tokens, s.target_forwards) == (self.served_tokens, self.served_forwards)
            and self.output_ids == list(self.record.output_ids)
        )


def offline_cap(rec: TrafficRecord, eos_ids: Sequence[int]) -> int:
    """Tokens to measure the request for (module docstring)."""
    n, cap = len(rec.output_ids), rec.sampling.max_tokens
    cut_by_stop_string = rec.finish_reason == "stop" and n < cap and bool(rec.output_ids) and rec.output_ids[-1] not in set(eos_ids)
    return n if is_greedy(rec) and cut_by_stop_string else cap


def prepare(records: Sequence[TrafficRecord], engine, *, source: str, too_long: list[str] | None = None) -> tuple[list[TrafficItem], list[str]]:
    """(the measurable records as items, one line per skipped record). A token id outside the
    target's vocabulary is a one-line UserError: the traffic came from another target's tokenizer.
    ``too_long`` also collects the lines of records skipped because the bundle cannot hold their
    prompt (the others were never measurable: not finished, speculation off, nothing generated)."""
    items: list[TrafficItem] = []
    skipped: list[str] = []
    vocab = engine.target.vocab_size
    for rec in records:
        top = max(rec.prompt_ids + list(rec.output_ids))
        if top >= vocab:
            raise UserError(
                f"{source}: request {rec.request_id}",
                f"token id {top} is outside the target's vocabulary of {vocab}",
                "this traffic was captured from a bundle of another target; pass that bundle or traffic this target served",
            )
        a = rec.acceptance
        if rec.finish_reason not in FINISHED or a.target_forwards == 0:
            skipped.append(f"{rec.request_id}: not finished (finish_reason {rec.finish_reason})")
        elif not a.speculative and a.draft_tokens == 0 and a.completion_tokens >= 3:
            skipped.append(f"{rec.request_id}: speculation was off for the request")
        elif len(rec.prompt_ids) >= engine.max_seq_len - 1:
            skipped.append(f"{rec.request_id}: {len(rec.prompt_ids)} prompt tokens >= max_seq_len {engine.max_seq_len}")
            if too_long is not None:
                too_long.append(skipped[-1])
        else:
            cap = offline_cap(rec, engine.eos_token_ids)
            if cap < 1:
                skipped.append(f"{rec.request_id}: no tokens generated")
                continue
            items.append(TrafficItem(rec, cap, is_greedy(rec)))
    return items, skipped


def measure_items(
    engine, items: Sequence[TrafficItem], *, k: int, sweep: Sequence[int] = (), batch_size: int = 16, say: Callable[[str], None] | None = None
) -> None:
    """Fill each item's offline ``stats`` / ``output_ids`` (and ``stats_by_k`` for greedy ones with a sweep) at draft length ``k``."""
    say = say or (lambda m: None)
    greedy = [it for it in items if it.greedy]
    by_cap: dict[int, list[TrafficItem]] = {}
    for it in greedy:
        by_cap.setdefault(it.max_tokens, []).append(it)
    if greedy:
        say(f"estimating {len(greedy)} greedy requests at K={k}" + (f" (sweep {','.join(map(str, sweep))})" if sweep else ""))
    for cap, group in sorted(by_cap.items()):
        est = estimate(engine, [list(it.record.prompt_ids) for it in group], cap, k=k, batch_size=batch_size, sweep=sweep)
        for n, it in enumerate(group):
            it.stats, it.output_ids = est.stats[n], list(est.continuations[n])
            it.stats_by_k = {kk: v[n] for kk, v in est.by_k.items()}
    sampled = [it for it in items if not it.greedy]
    if sampled:
        say(f"generating {len(sampled)} sampled requests at K={k}")
    saved = engine.max_draft_len
    engine.max_draft_len = k
    try:
        for it in sampled:
            s = it.record.sampling
            params = SamplingParams(max_tokens=it.max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed)
            (res,) = engine.generate([list(it.record.prompt_ids)], params)
            it.stats, it.output_ids = res.stats, list(res.token_ids)
    finally:
        engine.max_draft_len = saved


def greedy_outputs(engine, items: Sequence[TrafficItem], *, speculate: bool, batch_size: int = 16) -> list[list[int]]:
    """Each greedy item's output from running the engine (speculative or target-only), in order."""
    out: dict[int, list[int]] = {}
    by_cap: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        by_cap.setdefault(it.max_tokens, []).append(i)
    for cap, idx in sorted(by_cap.items()):
        for s in range(0, len(idx), batch_size):
            chunk = idx[s : s + batch_size]
            res = engine.generate([list(items[i].record.prompt_ids) for i in chunk], SamplingParams(max_tokens=cap), speculate=speculate)
            for i, r in zip(chunk, res):
                out[i] = list(r.token_ids)
    return [out[i] for i in range(len(items))]


def prompt_groups(records: Sequence[TrafficRecord]) -> dict[int, int]:
    """id(record) -> its prompt group (formats/traffic_split.group_prompts: the same prompt, the same
    text, or a near-duplicate is one group): the independent units the gate counts and resamples."""
    return {id(r): g for r, g in zip(records, group_prompts(list(records)), strict=True)}
