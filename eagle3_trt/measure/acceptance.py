"""Acceptance of a bundle on a prompt set: every turn of every conversation, per category.

``measure`` encodes each chat turn with the bundle's chat template (later turns see the target's
own earlier replies) and each raw completion record as TensorRT-LLM encodes a completion
prompt, measures greedy acceptance with the estimator (or by running speculative generation,
which gives identical counts) and returns a ``Measurement``: per-turn stats that
aggregate overall, per category and per swept draft length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eagle3_trt.convert.prompts import IDS, PromptRecord, encode_chat, encode_raw, use_chat_template
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.core.stats import AggregateStats, RequestStats, aggregate
from eagle3_trt.errors import IncompleteMeasurement, UserError
from eagle3_trt.measure.cost_model import expected_tokens
from eagle3_trt.measure.estimator import estimate
from eagle3_trt.progress import Advance


@dataclass
class TurnResult:
    record_id: str
    category: str
    turn: int
    prompt_tokens: int
    stats: RequestStats
    continuation: list[int]
    prompt_ids: list[int] = field(default_factory=list, repr=False)
    stats_by_k: dict[int, RequestStats] = field(default_factory=dict, repr=False)  # with a K sweep

    def to_dict(self) -> dict:
        s = self.stats
        return {
            "id": self.record_id,
            "category": self.category,
            "turn": self.turn,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": s.generated_tokens,
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
            "target_forwards": s.target_forwards,
            "alpha": s.acceptance_rate,
            "acceptance_length": s.acceptance_length,
            "accepted_per_position": s.accepted_per_position,
            "drafted_per_position": s.drafted_per_position,
            # draft tokens accepted per verification, in order, at the run's K and at each swept K
            # (recommend replays them through TensorRT-LLM's acceptance gate: measure/gate_replay.py)
            "accepted_seq": s.accepted_seq,
            "accepted_seq_by_k": {str(k): st.accepted_seq for k, st in sorted(self.stats_by_k.items())},
        }


@dataclass
class Measurement:
    label: str
    results: list[TurnResult]
    skipped: list[str]
    seconds: float
    chat_template: bool  # the tokenizer has a chat template
    raw_prompts: int = 0  # measured turns encoded as raw completion text (no template)
    asked: int | None = None  # turns the file (and --limit, --turns) asked for; None: as many as measured

    @property
    def missing(self) -> int:
        """Turns asked for but not measured (each reason is a line of ``skipped``)."""
        return max(0, (self.asked if self.asked is not None else len(self.results)) - len(self.results))

    def incomplete(self, where: str) -> IncompleteMeasurement | None:
        """``incomplete`` of this measurement."""
        return incomplete(self.asked, len(self.results), self.skipped, where)

    def by_category(self) -> dict[str, AggregateStats]:
        cats: dict[str, list[RequestStats]] = {}
        for r in self.results:
            cats.setdefault(r.category, []).append(r.stats)
        return {c: aggregate(v) for c, v in sorted(cats.items())}

    def overall(self) -> AggregateStats:
        return aggregate(r.stats for r in self.results)

    def sweep(self) -> dict[int, dict]:
        """Per swept K: measured alpha and acceptance length, next to the acceptance length the cost
        model predicts from the largest K's per-position acceptance (E_K = 1 + sum of the first K)."""
        ks = sorted(set.intersection(*(set(r.stats_by_k) for r in self.results))) if self.results else []
        if not ks:
            return {}
        cum = aggregate(r.stats_by_k[ks[-1]] for r in self.results).cumulative_acceptance
        out = {}
        for k in ks:
            a = aggregate(r.stats_by_k[k] for r in self.results)
            out[k] = {
                "alpha": a.alpha,
                "acceptance_length": a.acceptance_length,
                "predicted_acceptance_length": expected_tokens(cum, k),
                "cumulative_acceptance": a.cumulative_acceptance,
                # the counts behind the figures: recommend --write records them as the bundle's acceptance at K
                "turns": a.requests,
                "generated_tokens": a.generated_tokens,
                "target_forwards": a.target_forwards,
            }  # measured at this K: recommend predicts K from it
        return out

    def to_dict(self) -> dict:
        d = {
            "label": self.label,
            "overall": self.overall().to_dict(),
            "by_category": {c: a.to_dict() for c, a in self.by_category().items()},
            "requests": [r.to_dict() for r in self.results],
            "skipped": self.skipped,
            "seconds": self.seconds,
            "chat_template": self.chat_template,
            "raw_prompts": self.raw_prompts,
        }
        if self.asked is not None:
            d["requests_asked"], d["requests_skipped"] = self.asked, self.missing
        sw = self.sweep()
        if sw:
            d["sweep"] = {str(k): v for k, v in sw.items()}
        return d


def incomplete(asked: int | None, measured: int, skipped: Sequence[str], where: str, *, what: str = "requests") -> IncompleteMeasurement | None:
    """The one-line error for a measurement that measured nothing, or fewer ``what`` than asked (None:
    complete). ``asked`` None: as many as were measured (a report written before it was recorded)."""
    missing = (asked if asked is not None else measured) - measured
    if missing <= 0 and measured:
        return None
    first = f" (first: {skipped[0]})" if skipped else ""
    hint = "shorten or drop those prompts, or build the bundle with a larger --max-seq-len"
    if not measured:
        return IncompleteMeasurement(where, f"measured no {what[:-1]}: all {asked or 0} asked were skipped{first}; nothing written", hint)
    return IncompleteMeasurement(where, f"measured {measured} of the {asked} {what} asked: {missing} skipped{first}", hint)


def measure(
    engine,
    records: Sequence[PromptRecord],
    *,
    label: str,
    max_tokens: int = 128,
    turns: str = "all",
    method: str = "estimator",
    batch_size: int = 16,
    k: int | None = None,
    sweep: Sequence[int] = (),
    chat_template: bool | None = None,
    temperature: float = 0.0,
    progress: Callable[[str, int], Advance] | None = None,
) -> Measurement:
    """Greedy acceptance of ``engine`` on every turn of every record (later turns see the target's own replies).

    ``sweep``: draft lengths to measure as well (estimator only: one continuation serves every K).
    ``chat_template``: None encodes each record by its kind (chat turns through the template, raw
    completion records as they are), True / False forces it (``convert.prompts.use_chat_template``).
    ``temperature`` > 0: sampled (seed 0 per batch), by speculative generation only, served as the
    engine's ``sampling`` flags say (core/spec_sampling.py).
    ``progress(desc, total)``: a task of the commands' progress display (eagle3_trt/progress.py),
    advanced per prompt turn measured, with the tokens generated so far beside it.
    """
    if turns not in ("all", "first"):
        raise UserError("--turns", f"{turns!r}", "use 'all' or 'first'")
    if method not in ("estimator", "generate"):
        raise UserError("--method", f"{method!r}", "use 'estimator' or 'generate'")
    if sweep and method != "estimator":
        raise UserError("--sweep", "needs the estimator", "drop --method generate (the estimator's counts are identical)")
    if temperature < 0 or (temperature > 0 and method != "generate"):
        raise UserError("--temperature", f"{temperature}", "use 0 (greedy), or a positive temperature with --method generate (the estimator is greedy)")
    templated = use_chat_template(list(records), chat_template)
    t0 = time.perf_counter()
    tok = engine.tokenizer
    history: dict[int, list[dict]] = {i: [] for i in range(len(records))}
    results: list[TurnResult] = []
    skipped: list[str] = []
    n_raw = 0
    n_turns = 1 if turns == "first" else max(len(r.turns) for r in records)
    asked = sum(min(len(r.turns), n_turns) for r in records)
    tick = _ticker(progress, f"{label}: prompts", asked)
    for t in range(n_turns):
        idx, prompts = _turn_prompts(engine, records, templated, history, t, skipped, n_turns)
        if not prompts:
            break
        stats, conts, by_k = _continue_turn(
            engine, prompts, method=method, max_tokens=max_tokens, k=k, batch_size=batch_size, sweep=sweep, temperature=temperature, tick=tick
        )
        stop = set(engine.eos_token_ids)
        for i, p, st, c, bk in zip(idx, prompts, stats, conts, by_k):
            results.append(TurnResult(records[i].id, records[i].category, t + 1, len(p), st, c, p, bk))
            n_raw += not templated[i] and records[i].kind != IDS  # token ids are not text sent raw
            reply = tok.decode([x for x in c if x not in stop], skip_special_tokens=True) if tok is not None else ""
            history[i] = history[i] + [{"role": "assistant", "content": reply}]
    return Measurement(label, results, skipped, time.perf_counter() - t0, bool(getattr(tok, "chat_template", None)), n_raw, asked)


def _turn_prompts(
    engine, records: Sequence[PromptRecord], templated: list[bool], history: dict[int, list[dict]], t: int, skipped: list[str], n_turns: int = 1
) -> tuple[list[int], list[list[int]]]:
    """(record indices, prompt ids) of turn ``t``; extends ``history`` with the user turn, and drops
    (into ``skipped``) a record whose prompt no longer fits, with its later turns."""
    idx, prompts = [], []
    for i, rec in enumerate(records):
        if t >= len(rec.turns) or history[i] is None:
            continue
        msgs = history[i] + [{"role": "user", "content": rec.turns[t]}]
        if rec.kind == IDS:
            ids = list(rec.ids)  # measured as stored (a held-out file: the build's own check)
            if max(ids) >= engine.target.vocab_size:
                raise UserError(
                    f"prompt {rec.id}",
                    f"token id {max(ids)} is outside the target's vocabulary of {engine.target.vocab_size}",
                    "these ids belong to another tokenizer",
                )
        else:
            ids = encode_chat(engine.tokenizer, msgs) if templated[i] else encode_raw(engine.tokenizer, rec.turns[t])
        if len(ids) >= engine.max_seq_len - 1:
            later = min(len(rec.turns), n_turns) - t - 1  # asked for, and dropped with this one
            skipped.append(
                f"{rec.id} turn {t + 1}: {len(ids)} prompt tokens >= max_seq_len {engine.max_seq_len}"
                + (f" (and its {later} later turns)" if later > 0 else "")
            )
            history[i] = None  # type: ignore[assignment]
            continue
        history[i] = msgs
        idx.append(i)
        prompts.append(ids)
    return idx, prompts


def _ticker(progress: Callable[[str, int], Advance] | None, desc: str, total: int) -> Callable[[int, int], None] | None:
    """``tick(prompts, tokens)`` onto a progress task, showing the tokens generated so far (at most
    one display update per prompt or per 16 tokens: the decode loop calls it per token)."""
    if progress is None:
        return None
    advance = progress(desc, total)
    seen = {"tokens": 0, "shown": 0}

    def tick(prompts: int, tokens: int) -> None:
        seen["tokens"] += tokens
        if prompts or seen["tokens"] - seen["shown"] >= 16:
            seen["shown"] = seen["tokens"]
            advance(prompts, info=f"{seen['tokens']} tokens")

    return tick


def _continue_turn(
    engine,
    prompts: list[list[int]],
    *,
    method: str,
    max_tokens: int,
    k: int | None,
    batch_size: int,
    sweep: Sequence[int],
    temperature: float = 0.0,
    tick: Callable[[int, int], None] | None = None,
) -> tuple[list, list[list[int]], list[dict]]:
    """(stats, continuations, stats per swept K) of one turn's prompts, by the estimator or by generating."""
    if method == "estimator":
        est = estimate(engine, prompts, max_tokens, k=k, batch_size=batch_size, sweep=sweep, tick=tick)
        by_k = [{kk: v[n] for kk, v in est.by_k.items()} if sweep else {} for n in range(len(prompts))]
        return est.stats, est.continuations, by_k
    stats, conts = [], []
    for s in range(0, len(prompts), batch_size):
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=0 if temperature > 0 else None)
        for rr in engine.generate(prompts[s : s + batch_size], params):
            stats.append(rr.stats)
            conts.append(rr.token_ids)
            if tick is not None:
                tick(1, len(rr.token_ids))
    return stats, conts, [{} for _ in prompts]
