"""Acceptance (alpha) measurement: a fast greedy estimator, per-category reports, plots, diagnostics.

The estimator reproduces greedy chain speculative decoding exactly without running it:

1. the target's own greedy continuation of every prompt, decoded in one batch across prompts
   (K = 0), keeping the aux hidden states of every position as they are produced;
2. the draft's K steps for *every* position at once (``teacher_forced_drafts``): step 1 is the
   draft's context pass over the whole sequence; step s attends to the step-1 entries up to its
   origin plus its own steps 2..s (a "diagonal" mask), which is exactly the attention pattern
   the runtime has after rolling back rejected drafts;
3. a walk over the continuation that replays the runtime's iterations (root = last accepted
   token, k = min(K, tokens left - 1), accept while the draft equals the continuation); none
   of the above depends on K below the drafted depth, so one run replays several K (sweep).

With greedy decoding the accepted tokens *are* the target's greedy continuation, so the counts
equal those of running ``SpeculativeEngine.generate`` (tests/test_alpha_estimator.py checks this
on the tiny pair); the cost is a few batched passes instead of one sequential iteration per
accepted run of tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle3_trt.errors import UserError
from eagle3_trt.runtime.cost_model import expected_tokens
from eagle3_trt.core.stats import AggregateStats, RequestStats, aggregate
from eagle3_trt.core.target import column_windows


# ---------------------------------------------------------------------------------------------
# Batched multi-step drafting over whole sequences
# ---------------------------------------------------------------------------------------------
def teacher_forced_drafts(draft, embed_fn, aux: torch.Tensor, tokens: torch.Tensor, k: int,
                          feed: str = "draft", d2t_ids: torch.Tensor | None = None, start: int = 0,
                          starts: torch.Tensor | None = None, span: int | None = None):
    """Draft logits for steps 1..k at every origin position, in k batched passes.

    ``aux`` [B, >= N-1, A]: target aux states; ``tokens`` [B, N] target ids (right-padded; padding
    never influences valid positions because all attention is causal in the origin).
    Origin p pairs the state of position p with token p+1 (p = 0..N-2). Step s at origin p
    predicts token p+s+1. ``feed``: "draft" feeds step s the draft's own step s-1 prediction
    (what the runtime does), "truth" feeds the true token p+s (training-time test).
    Steps 2..k run only for origins >= ``start`` (step 1 always runs over all origins: it is the
    context every later step attends to); the returned tensors of steps >= 2 cover origins
    start..N-2.
    Returns a list of k draft-logit tensors: [B, N-1, draft_vocab] for step 1, [B, N-1-start, D] after.

    ``starts`` [B] (long) with ``span``: per-row first origin instead of ``start``; every step's
    logits (step 1's too) then cover origins starts[b] .. starts[b]+span-1 of each row only
    (clamped to N-2; those past a row's end are garbage): [B, span, D]. Same attention pattern
    per origin, far fewer queries and head evaluations when the rows' prompts differ in length.
    """
    if starts is not None:
        return _teacher_forced_drafts_rows(draft, embed_fn, aux, tokens, k, feed, d2t_ids, starts, span)
    B, N = tokens.shape
    P = N - 1
    Q = P - start
    dev = aux.device
    d2t_ids, pos, causal, h, logits, kv = _draft_step1(draft, embed_fn, aux, tokens, d2t_ids)
    outs = [logits]
    ctx = causal[start:]  # step >= 2 queries (origins start..P-1) see step-1 entries up to their origin
    diag = torch.eye(Q, dtype=torch.bool, device=dev)
    hidden = h[:, start:]
    prev = logits[:, start:]
    for s in range(2, k + 1):
        if feed == "draft":
            inp_tok = d2t_ids[prev.argmax(-1)]
        else:
            shifted = tokens[:, start + s:]
            inp_tok = torch.cat([shifted, torch.zeros(B, Q - shifted.shape[1], dtype=tokens.dtype, device=dev)], dim=1)
        mask = torch.cat([ctx] + [diag] * (s - 1), dim=1)[None].expand(B, -1, -1)
        hidden, prev, kv = draft(embed_fn(inp_tok), hidden, pos[:, start:] + (s - 1), past=kv, mask=mask)
        outs.append(prev)
    return outs


def _draft_step1(draft, embed_fn, aux, tokens, d2t_ids, with_logits: bool = True):
    """Draft step 1 at every position in one causal pass (fc over the target's aux states)."""
    B, N = tokens.shape
    P = N - 1
    dev = aux.device
    if d2t_ids is None:
        d2t_ids = torch.arange(draft.config.draft_vocab_size, device=dev) + draft.d2t.to(dev)
    pos = torch.arange(P, device=dev)[None].expand(B, P)
    causal = torch.tril(torch.ones(P, P, dtype=torch.bool, device=dev))
    h, logits, kv = draft(embed_fn(tokens[:, 1:]), draft.fuse(aux[:, :P]), pos, past=None,
                          mask=causal[None].expand(B, -1, -1), with_logits=with_logits)
    return d2t_ids, pos, causal, h, logits, kv


def _teacher_forced_drafts_rows(draft, embed_fn, aux, tokens, k, feed, d2t_ids, starts, span):
    B, N = tokens.shape
    P = N - 1
    dev = aux.device
    # step 1 runs over every position (the context later steps attend to), but its head only
    # where a drafted token is scored: the origins from each row's start
    d2t_ids, pos, causal, h, _, kv = _draft_step1(draft, embed_fn, aux, tokens, d2t_ids, with_logits=False)
    Q = max(int(span), 1)
    org = (starts.to(dev)[:, None] + torch.arange(Q, device=dev)[None]).clamp(max=P - 1)  # [B, Q] origins
    hidden = h.gather(1, org[..., None].expand(-1, -1, h.shape[-1]))
    prev = draft.logits(hidden)
    outs = [prev]
    if k < 2:
        return outs
    ctx = torch.arange(P, device=dev)[None, None, :] <= org[:, :, None]  # [B, Q, P]
    diag = torch.eye(Q, dtype=torch.bool, device=dev)[None].expand(B, -1, -1)
    for s in range(2, k + 1):
        if feed == "draft":
            inp_tok = d2t_ids[prev.argmax(-1)]
        else:
            inp_tok = tokens.gather(1, (org + s).clamp(max=N - 1))
        mask = torch.cat([ctx] + [diag] * (s - 1), dim=2)
        hidden, prev, kv = draft(embed_fn(inp_tok), hidden, org + (s - 1), past=kv, mask=mask)
        outs.append(prev)
    return outs


# ---------------------------------------------------------------------------------------------
# Replaying the runtime's iterations
# ---------------------------------------------------------------------------------------------
def walk_chain(seq: Sequence[int], prompt_len: int, preds: Sequence[Sequence[int]], k: int, max_tokens: int,
               max_seq_len: int, stop_ids: frozenset[int]) -> RequestStats:
    """Stats of greedy chain speculation over a known greedy continuation.

    ``seq`` = prompt + continuation (as the runtime emitted it); ``preds[s-1][p]`` = draft step s
    prediction (target id) at origin p.
    """
    st = RequestStats(speculation=True)
    cont = len(seq) - prompt_len
    if cont <= 0:
        return st
    st.target_forwards, st.generated_tokens = 1, 1
    g, r = 1, prompt_len  # tokens emitted; position of the root (last emitted token)
    end = len(seq) - 1
    while g < cont:
        kk = max(0, min(k, max_tokens - g - 1, max_seq_len - (prompt_len + g) - 1))
        a = 0
        while a < kk and r + a + 1 <= end and preds[a][r - 1] == seq[r + a + 1]:
            a += 1
            if seq[r + a] in stop_ids:
                break
        if kk > 0:
            stopped = a > 0 and seq[r + a] in stop_ids
            st.record_iteration(kk, a if stopped else min(a + 1, kk), a)
        st.target_forwards += 1
        step = min(a + 1, cont - g)
        st.generated_tokens += step
        g += a + 1
        r += a + 1
    return st


@dataclass
class EstimateResult:
    stats: list[RequestStats]  # at the engine's (or the requested) K
    continuations: list[list[int]]
    finish_reasons: list[str | None]
    by_k: dict[int, list[RequestStats]] = field(default_factory=dict)  # every K measured (``sweep`` adds more)


def _cache_layers(cache) -> list | None:
    """The per-layer (keys, values) holders of an HF DynamicCache (transformers 4.56+ and 5.x), or None."""
    layers = getattr(cache, "layers", None)
    if layers is None or not all(hasattr(lay, "keys") and hasattr(lay, "values") for lay in layers):
        return None
    return list(layers)


# Decode attention windows: a run of rows shares one window while its longest prompt is within
# this ratio (or a quarter of this many tokens) of its shortest; each extra window is one more
# attention call per layer and pass.
WINDOW_RATIO, WINDOW_MIN_PAD = 1.5, 64


def _length_buckets(lens: list[int], max_ratio: float = 1.25, min_pad_tokens: int = 64) -> list[list[int]]:
    """Split ascending ``lens`` (indices 0..n-1) into runs whose padding waste stays small."""
    out: list[list[int]] = []
    for i, n in enumerate(lens):
        if out and (n <= lens[out[-1][0]] * max_ratio or n - lens[out[-1][0]] <= min_pad_tokens // 4):
            out[-1].append(i)
        else:
            out.append([i])
    return out


@torch.inference_mode()
def greedy_continuations(engine, prompts: list[list[int]], max_tokens: int):
    """What ``engine.generate_with_aux(prompts, greedy max_tokens)`` returns, computed faster.

    Same target passes (a prefill, then one pass per generated token) and the same stopping
    rules, but: prompts (ascending length) are prefilled in groups of similar length, so the
    O(S^2) prefill is not padded to the longest prompt of the batch; the groups' KV caches are
    then merged (left-padded, as the engine lays them out) into one preallocated cache for a
    single batched decode (appends write in place instead of concatenating), so the number of
    sequential target passes stays max_tokens; rows that finish leave the batch; no per-row
    engine bookkeeping. Returns (results, aux states) like generate_with_aux. Falls back to
    ``generate_with_aux`` for invalid prompts, which the engine reports.
    """
    from eagle3_trt.core.engine import RequestResult, SamplingParams

    tgt = engine.target
    params = SamplingParams(max_tokens=max_tokens)
    V = tgt.vocab_size
    if (max_tokens == 0 or not prompts
            or any(not p or len(p) >= engine.max_seq_len or min(p) < 0 or max(p) >= V for p in prompts)):
        return engine.generate_with_aux(prompts, params)
    stop = frozenset(engine.eos_token_ids) | frozenset(params.stop_token_ids)
    pad = engine.pad_token_id
    B = len(prompts)
    lens = [len(p) for p in prompts]
    if lens != sorted(lens):  # the merged cache is laid out by ascending length
        order = sorted(range(B), key=lambda i: lens[i])
        res, auxs = greedy_continuations(engine, [prompts[i] for i in order], max_tokens)
        back = {i: r for r, i in enumerate(order)}
        return [res[back[i]] for i in range(B)], [auxs[back[i]] for i in range(B)]
    S = lens[-1]
    tokens = [list(p) for p in prompts]
    finished = [False] * B
    reasons: list[str | None] = [None] * B
    aux_rows: list[list[torch.Tensor]] = [[] for _ in range(B)]

    def emit(b: int, tok: int) -> None:
        tokens[b].append(tok)
        if tok in stop:
            finished[b], reasons[b] = True, "stop"
        elif len(tokens[b]) - lens[b] >= max_tokens or len(tokens[b]) >= engine.max_seq_len:
            finished[b], reasons[b] = True, "length"

    # ---- prefill, per group of similar lengths ----
    groups = _length_buckets(lens)
    kv: list[tuple[list[torch.Tensor], list[torch.Tensor], int]] = []  # (keys per layer, values per layer, width)
    for g in groups:
        Sg = lens[g[-1]]
        ids = torch.full((len(g), Sg), pad, dtype=torch.long)
        valid = torch.zeros(len(g), Sg, dtype=torch.bool)
        for r, b in enumerate(g):
            ids[r, Sg - lens[b]:] = torch.tensor(prompts[b])
            valid[r, Sg - lens[b]:] = True
        pos = (valid.cumsum(-1) - 1).clamp(min=0)
        allowed = torch.tril(torch.ones(Sg, Sg, dtype=torch.bool))[None] & valid[:, None, :]
        allowed |= torch.eye(Sg, dtype=torch.bool)[None]
        cache = tgt.new_cache()
        logits, aux = tgt.forward(ids, pos, allowed, cache, logits_at=torch.full((len(g), 1), Sg - 1))
        layers = _cache_layers(cache)
        if layers is None:
            return engine.generate_with_aux(prompts, params)
        kv.append(([lay.keys for lay in layers], [lay.values for lay in layers], Sg))
        first = logits[:, 0].argmax(-1).tolist()
        for r, b in enumerate(g):
            aux_rows[b].append(aux[r, Sg - lens[b]:])
            emit(b, first[r])

    # ---- merge the groups' caches into one left-padded cache with room for the decode ----
    del cache, layers  # only kv refers to the groups' K/V now, and the merge releases them layer by layer
    steps = min(max_tokens, engine.max_seq_len - lens[0])  # decode passes at most (lens ascend)
    cache = tgt.preallocated_cache([(ks, vs) for ks, vs, _ in kv], S + steps)
    del kv
    cols = torch.arange(S)
    t_valid = cols[None, :] >= (S - torch.tensor(lens))[:, None]  # [B, S]

    # ---- batched greedy decode; rows that finished leave the batch ----
    live = [b for b in range(B) if not finished[b]]
    if len(live) < B:
        keep = torch.tensor(live, dtype=torch.long)
        cache.keep_rows(keep)
        t_valid = t_valid[keep]
    windows = None
    while live:
        n = len(live)
        if windows is None:  # attention per run of similar lengths skips the others' left padding
            windows = [(w[0], w[-1] + 1, S - lens[live[w[-1]]])
                       for w in _length_buckets([lens[b] for b in live], WINDOW_RATIO, WINDOW_MIN_PAD)]
        ids = torch.tensor([[tokens[b][-1]] for b in live])
        pos = torch.tensor([[len(tokens[b]) - 1] for b in live])
        allowed = torch.cat([t_valid[:, None, :], torch.ones(n, 1, 1, dtype=torch.bool)], dim=-1)
        with column_windows(windows):
            logits, aux = tgt.forward(ids, pos, allowed, cache)
        nxt = logits[:, 0].argmax(-1).tolist()
        for r, b in enumerate(live):
            aux_rows[b].append(aux[r, :1])
            emit(b, nxt[r])
        t_valid = torch.cat([t_valid, torch.ones(n, 1, dtype=torch.bool)], dim=1)
        still = [r for r, b in enumerate(live) if not finished[b]]
        if len(still) < n and still:
            keep = torch.tensor(still, dtype=torch.long)
            cache.keep_rows(keep)
            t_valid = t_valid[keep]
            windows = None
        live = [live[r] for r in still]
    res = [RequestResult(t[lens[b]:], reasons[b], None) for b, t in enumerate(tokens)]
    return res, [torch.cat(aux_rows[b])[: len(tokens[b]) - 1] for b in range(B)]


@torch.inference_mode()
def estimate(engine, prompts: list[list[int]], max_tokens: int, k: int | None = None, batch_size: int = 16,
             sweep: Sequence[int] = ()) -> EstimateResult:
    """Greedy chain acceptance of ``engine``'s draft on ``prompts``, identical to running it.

    The target runs once, without speculation, batched over prompts; the aux states it produced
    for every token are kept and the draft's K steps run over them for all positions at once.

    ``sweep``: further draft lengths to replay (``EstimateResult.by_k``). Neither the target's
    greedy continuation nor the draft's step-s prediction at a position depends on K, so every
    K up to the largest costs one more replay walk, where measuring by generation costs one
    more run per K.
    """
    k = engine.max_draft_len if k is None else int(k)
    if engine.draft is None:
        raise UserError("draft", "the engine has no draft", "load a bundle or pair with a draft")
    ks = sorted({k, *(int(x) for x in sweep)})
    if ks[0] < 1:
        raise UserError("max_draft_len", f"{ks[0]}", "measure with K >= 1")
    k_max = ks[-1]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    conts: list[list[int]] = [[] for _ in prompts]
    reasons: list[str | None] = [None] * len(prompts)
    by_k: dict[int, list[RequestStats]] = {kk: [RequestStats() for _ in prompts] for kk in ks}
    stop = frozenset(engine.eos_token_ids)
    dev = engine.device
    d2t_ids = engine._d2t_ids
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        res, auxs = greedy_continuations(engine, [prompts[j] for j in idx], max_tokens)
        seqs = [prompts[j] + r.token_ids for j, r in zip(idx, res)]
        for j, r in zip(idx, res):
            conts[j], reasons[j] = r.token_ids, r.finish_reason
        # draft over groups of similar total length (step 1 runs over every position of the padded batch)
        by_len = sorted(range(len(seqs)), key=lambda b: len(seqs[b]))
        for bucket in _length_buckets([len(seqs[b]) for b in by_len]):
            grp = [by_len[x] for x in bucket]
            gseqs = [seqs[b] for b in grp]
            Bg, N = len(gseqs), max(len(s) for s in gseqs)
            if N < 2:
                continue
            ids = torch.full((Bg, N), engine.pad_token_id, dtype=torch.long)
            aux = torch.zeros(Bg, N - 1, auxs[0].shape[-1], dtype=auxs[0].dtype, device=dev)
            for r, b in enumerate(grp):
                ids[r, : len(seqs[b])] = torch.tensor(seqs[b])
                aux[r, : auxs[b].shape[0]] = auxs[b]
            # first origin that drafts a continuation token, per row
            starts = [max(len(prompts[idx[b]]) - 1, 0) for b in grp]
            span = max(max(len(seqs[b]) - 1 - st for b, st in zip(grp, starts)), 1)
            logits = teacher_forced_drafts(engine.draft, engine._draft_embed, aux, ids.to(dev), k_max, feed="draft",
                                           d2t_ids=d2t_ids, starts=torch.tensor(starts), span=span)
            steps = [d2t_ids[lg.argmax(-1)].cpu() for lg in logits]
            for r, b in enumerate(grp):
                j = idx[b]
                preds = [[-1] * starts[r] + p[r].tolist() for p in steps]
                for kk in ks:
                    by_k[kk][j] = walk_chain(seqs[b], len(prompts[j]), preds, kk, max_tokens, engine.max_seq_len, stop)
    return EstimateResult(by_k[k], conts, reasons, by_k)


# ---------------------------------------------------------------------------------------------
# Prompts and chat templates
# ---------------------------------------------------------------------------------------------
@dataclass
class PromptRecord:
    id: str
    category: str
    turns: list[str]


def load_prompts(path: Path, limit: int | None = None) -> list[PromptRecord]:
    """JSONL with ``turns`` (list of user messages) and an optional ``category`` (MT-Bench layout)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(path, "prompt file not found", "pass a JSONL file with one {\"turns\": [...]} object per line")
    out: list[PromptRecord] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}", f"not valid JSON ({e.msg})", "one JSON object per line") from None
        turns = obj.get("turns") if isinstance(obj, dict) else None
        if turns is None and isinstance(obj, dict) and isinstance(obj.get("text") or obj.get("prompt"), str):
            turns = [obj.get("text") or obj.get("prompt")]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UserError(f"{path}:{n}", "needs \"turns\": a non-empty list of non-empty strings",
                            "use the MT-Bench layout: {\"category\": \"writing\", \"turns\": [\"...\"]}")
        rid = str(obj.get("question_id", obj.get("id", n)))
        out.append(PromptRecord(rid, str(obj.get("category") or "all"), list(turns)))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise UserError(path, "no prompts in the file", "add at least one line with \"turns\"")
    return out


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation ending with the assistant's turn header (the bundle's chat template)."""
    if tokenizer is None:
        raise UserError("tokenizer", "the bundle has no tokenizer", "rebuild the bundle; it ships tokenizer/")
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    # no template: drafts lose much acceptance without the format they were trained on; say so in the report
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


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
        return {"id": self.record_id, "category": self.category, "turn": self.turn, "prompt_tokens": self.prompt_tokens,
                "generated_tokens": s.generated_tokens, "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
                "target_forwards": s.target_forwards, "alpha": s.acceptance_rate, "acceptance_length": s.acceptance_length,
                "accepted_per_position": s.accepted_per_position, "drafted_per_position": s.drafted_per_position}


@dataclass
class Measurement:
    label: str
    results: list[TurnResult]
    skipped: list[str]
    seconds: float
    chat_template: bool

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
            out[k] = {"alpha": a.alpha, "acceptance_length": a.acceptance_length,
                      "predicted_acceptance_length": expected_tokens(cum, k)}
        return out

    def to_dict(self) -> dict:
        d = {"label": self.label, "overall": self.overall().to_dict(),
             "by_category": {c: a.to_dict() for c, a in self.by_category().items()},
             "requests": [r.to_dict() for r in self.results], "skipped": self.skipped,
             "seconds": self.seconds, "chat_template": self.chat_template}
        sw = self.sweep()
        if sw:
            d["sweep"] = {str(k): v for k, v in sw.items()}
        return d


def measure(engine, records: list[PromptRecord], *, label: str, max_tokens: int = 128, turns: str = "all",
            method: str = "estimator", batch_size: int = 16, k: int | None = None,
            sweep: Sequence[int] = ()) -> Measurement:
    """Greedy acceptance of ``engine`` on every turn of every record (later turns see the target's own replies).

    ``sweep``: draft lengths to measure as well (estimator only: one continuation serves every K).
    """
    import time

    from eagle3_trt.core.engine import SamplingParams

    if turns not in ("all", "first"):
        raise UserError("--turns", f"{turns!r}", "use 'all' or 'first'")
    if method not in ("estimator", "generate"):
        raise UserError("--method", f"{method!r}", "use 'estimator' or 'generate'")
    if sweep and method != "estimator":
        raise UserError("--sweep", "needs the estimator", "drop --method generate (the estimator's counts are identical)")
    t0 = time.perf_counter()
    tok = engine.tokenizer
    history: dict[int, list[dict]] = {i: [] for i in range(len(records))}
    results: list[TurnResult] = []
    skipped: list[str] = []
    n_turns = 1 if turns == "first" else max(len(r.turns) for r in records)
    for t in range(n_turns):
        idx, prompts = [], []
        for i, rec in enumerate(records):
            if t >= len(rec.turns) or history[i] is None:
                continue
            msgs = history[i] + [{"role": "user", "content": rec.turns[t]}]
            ids = encode_chat(tok, msgs)
            if len(ids) >= engine.max_seq_len - 1:
                skipped.append(f"{rec.id} turn {t + 1}: {len(ids)} prompt tokens >= max_seq_len {engine.max_seq_len}")
                history[i] = None  # type: ignore[assignment]
                continue
            history[i] = msgs
            idx.append(i)
            prompts.append(ids)
        if not prompts:
            break
        if method == "estimator":
            est = estimate(engine, prompts, max_tokens, k=k, batch_size=batch_size, sweep=sweep)
            stats, conts = est.stats, est.continuations
            by_k = [{kk: v[n] for kk, v in est.by_k.items()} if sweep else {} for n in range(len(prompts))]
        else:
            stats, conts = [], []
            for s in range(0, len(prompts), batch_size):
                for rr in engine.generate(prompts[s:s + batch_size], SamplingParams(max_tokens=max_tokens)):
                    stats.append(rr.stats)
                    conts.append(rr.token_ids)
            by_k = [{} for _ in prompts]
        stop = set(engine.eos_token_ids)
        for i, p, st, c, bk in zip(idx, prompts, stats, conts, by_k):
            results.append(TurnResult(records[i].id, records[i].category, t + 1, len(p), st, c, p, bk))
            reply = tok.decode([x for x in c if x not in stop], skip_special_tokens=True) if tok is not None else ""
            history[i] = history[i] + [{"role": "assistant", "content": reply}]
    return Measurement(label, results, skipped, time.perf_counter() - t0,
                       bool(getattr(tok, "chat_template", None)))


# ---------------------------------------------------------------------------------------------
# Diagnostics: why is alpha low?
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def _step1(engine, seqs: list[list[int]], prompt_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Draft step-1 argmax (draft ids), the true token it should predict (over continuation
    positions), the draft's mean cross-entropy on the true tokens that are in its vocabulary, and
    its mean top-1 probability (confidence)."""
    preds, truth, nll, conf = [], [], [], []
    t2d = torch.full((engine.target.vocab_size,), -1, dtype=torch.long)
    t2d[engine._d2t_ids.cpu()] = torch.arange(engine._d2t_ids.numel())
    for s, n0 in zip(seqs, prompt_lens):
        if len(s) - n0 < 2:
            continue
        ids = torch.tensor([s])
        N = len(s)
        allowed = torch.tril(torch.ones(N, N, dtype=torch.bool))[None]
        _, aux = engine.target.forward(ids, torch.arange(N)[None], allowed, None, logits_at=torch.zeros(1, 1, dtype=torch.long))
        (lg,) = teacher_forced_drafts(engine.draft, engine._draft_embed, aux, ids.to(engine.device), 1, d2t_ids=engine._d2t_ids)
        lo = max(n0 - 1, 0)
        lg = lg[0, lo: N - 2].float().cpu()
        y = ids[0, lo + 2: N]
        preds.append(lg.argmax(-1))
        conf.append(torch.softmax(lg, -1).amax(-1))
        truth.append(y)
        d = t2d[y]
        ok = d >= 0
        if ok.any():
            nll.append(-torch.log_softmax(lg[ok], -1).gather(-1, d[ok][:, None])[:, 0])
    if not preds:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), float("nan"), 0.0
    return (torch.cat(preds), torch.cat(truth), float(torch.cat(nll).mean()) if nll else float("nan"),
            float(torch.cat(conf).mean()))


def diagnose(engine, m: Measurement, max_seqs: int = 16) -> list[dict]:
    """Checks that name the usual causes of a low alpha: wrong d2t, wrong aux layers, vocabulary coverage."""
    sample = m.results[:max_seqs]
    return diagnose_sequences(engine, [r.prompt_ids + r.continuation for r in sample], [len(r.prompt_ids) for r in sample])


def diagnose_sequences(engine, seqs: list[list[int]], prompt_lens: list[int]) -> list[dict]:
    out: list[dict] = []
    d2t_ids = engine._d2t_ids.cpu()
    pred, y, ce, confidence = _step1(engine, seqs, prompt_lens)
    if y.numel() < 8:
        return [{"check": "diagnostics", "ok": True, "detail": "too few generated tokens to diagnose"}]
    in_vocab = torch.isin(y, d2t_ids)
    cov = float(in_vocab.float().mean())
    out.append({"check": "draft_vocab_coverage", "ok": cov >= 0.7, "value": cov,
                "detail": f"{cov:.0%} of the target's generated tokens are in the draft vocabulary"
                          + ("" if cov >= 0.7 else " (acceptance is capped by this; the draft vocabulary does not fit this traffic)")})
    agree = float((d2t_ids[pred] == y).float().mean())
    uniform = 2.0 / engine.draft.config.draft_vocab_size
    confident = confidence >= max(0.2, 10 * uniform)
    out.append({"check": "draft_confidence", "ok": confident, "value": confidence,
                "detail": f"draft step-1 mean top-1 probability {confidence:.2f}"
                          + ("" if confident else " (near-uniform predictions: the draft is untrained, random, or "
                             "fed hidden states it was not trained on)")})
    # Would another draft->target map explain the draft's predictions much better? Fit the
    # best map (majority target token per draft id) on half of the positions, score the other half.
    fit_p, fit_y, ev_p, ev_y = pred[0::2], y[0::2], pred[1::2], y[1::2]  # interleaved halves
    best: dict[int, int] = {}
    for a in fit_p.unique().tolist():
        vals, counts = fit_y[fit_p == a].unique(return_counts=True)
        best[a] = int(vals[counts.argmax()])
    mapped = torch.tensor([best.get(a, -1) for a in ev_p.tolist()])
    hit = mapped == ev_y
    oracle = float(hit.float().mean())
    agree_ev = float((d2t_ids[ev_p] == ev_y).float().mean())
    distinct = len(set(ev_p[hit].tolist()))
    # only a confident draft can be "right under another labeling"; a random one is just wrong
    bad_map = confident and oracle >= 0.3 and oracle >= 2 * agree_ev + 0.1 and distinct >= 4
    out.append({"check": "d2t", "ok": not bad_map, "value": agree, "oracle": oracle,
                "detail": (f"draft step-1 top-1 matches the target {agree:.0%} of the time through d2t"
                           + (f", but {oracle:.0%} under a relabeling of {distinct} draft ids: d2t does not match the "
                              "draft's lm_head (shuffled, or from another draft vocabulary)" if bad_map else "")
                           + ("" if confident else " (d2t cannot be judged while the draft is near-uniform)"))})
    # Would other aux layers explain the draft better? (off-by-one conventions, order, non-default layers)
    cur = tuple(engine.target.aux_layer_ids)
    L = engine.target.num_layers
    alts = {"TensorRT-LLM default": (1, L // 2 - 1, L - 4), "ids - 1": tuple(i - 1 for i in cur),
            "ids + 1": tuple(i + 1 for i in cur), "ascending order": tuple(sorted(cur))}
    scores = {}
    for name, ids in alts.items():
        if ids == cur or ids in [v[0] for v in scores.values()] or len(set(ids)) != len(ids) or min(ids) < 0 \
                or max(ids) >= L or len(ids) != len(cur):
            continue
        engine.target.aux_layer_ids = ids
        try:
            p2, y2, ce2, _ = _step1(engine, seqs, prompt_lens)
        finally:
            engine.target.aux_layer_ids = cur
        scores[name] = (ids, float((d2t_ids[p2] == y2).float().mean()), ce2)
    if scores:
        name, (ids, sc, ce2) = max(scores.items(), key=lambda kv: (kv[1][1], -kv[1][2]))
        # flag a clearly better explanation: +10 points of top-1 agreement, or much lower loss and better agreement
        bad_aux = sc >= agree + 0.10 or (sc > agree and ce - ce2 >= 0.5)
        out.append({"check": "aux_layers", "ok": not bad_aux, "value": agree, "cross_entropy": ce,
                    "alternatives": {n: {"ids": list(i), "agreement": s, "cross_entropy": c} for n, (i, s, c) in scores.items()},
                    "detail": (f"captured layers {list(cur)}: step-1 agreement {agree:.0%}"
                               + (f"; with layers {list(ids)} ({name}) it is {sc:.0%}: the draft was probably trained on "
                                  f"those (set eagle3_layers_to_capture / eagle_aux_hidden_state_layer_ids)" if bad_aux else
                                  f"; best alternative {list(ids)} ({name}) gives {sc:.0%}"))})
    return out


# ---------------------------------------------------------------------------------------------
# Report: JSON, human summary, plot
# ---------------------------------------------------------------------------------------------
def compare(primary: Measurement, reference: Measurement | None) -> dict:
    """alpha / AL deltas (primary - reference), overall and per category present in both."""
    if reference is None:
        return {}

    def d(a: AggregateStats, b: AggregateStats) -> dict:
        return {"alpha": a.alpha - b.alpha, "acceptance_length": a.acceptance_length - b.acceptance_length,
                "cumulative_acceptance": [x - y for x, y in zip(a.cumulative_acceptance, b.cumulative_acceptance)]}

    pc, rc = primary.by_category(), reference.by_category()
    return {"overall": d(primary.overall(), reference.overall()),
            "by_category": {c: d(pc[c], rc[c]) for c in pc if c in rc}}


def summary_console(report: dict, width: int = 110):
    """A recording rich Console holding the human summary of an alpha report (for summary.txt)."""
    import io

    from rich.console import Console

    con = Console(record=True, width=width, file=io.StringIO(), highlight=False)
    render_summary(report, con)
    return con


def render_summary(report: dict, con) -> None:
    from rich.table import Table

    pairs = report["pairs"]
    prim = pairs["bundle"]
    ref = pairs.get("reference")
    tab = Table(title=f"acceptance on {report['settings']['prompts']} (greedy, K={report['settings']['max_draft_len']})")
    tab.add_column("category")
    tab.add_column("turns", justify="right")
    tab.add_column(f"alpha {prim['label']}", justify="right")
    if ref:
        tab.add_column(f"alpha {ref['label']}", justify="right")
        tab.add_column("delta", justify="right")
    tab.add_column("AL", justify="right")
    if ref:
        tab.add_column("AL ref", justify="right")
    cats = list(prim["by_category"]) + ["overall"]
    for c in cats:
        a = prim["overall"] if c == "overall" else prim["by_category"][c]
        row = [c, str(a["requests"]), f"{a['alpha']:.3f}"]
        if ref:
            b = ref["overall"] if c == "overall" else ref["by_category"].get(c)
            row += [f"{b['alpha']:.3f}", f"{a['alpha'] - b['alpha']:+.3f}"] if b else ["-", "-"]
        row.append(f"{a['acceptance_length']:.2f}")
        if ref:
            row.append(f"{b['acceptance_length']:.2f}" if b else "-")
        tab.add_row(*row, style="bold" if c == "overall" else None)
    con.print(tab)
    pos = Table(title="per-position acceptance (overall): cumulative P(first k accepted) / conditional P(k | 1..k-1)")
    pos.add_column("pair")
    K = len(prim["overall"]["cumulative_acceptance"])
    for k in range(K):
        pos.add_column(f"k={k + 1}", justify="right")
    for p in [prim] + ([ref] if ref else []):
        o = p["overall"]
        pos.add_row(p["label"], *[f"{c:.2f} / {q:.2f}" for c, q in zip(o["cumulative_acceptance"], o["conditional_acceptance"])])
    con.print(pos)
    if prim.get("sweep"):
        sw = Table(title="draft length sweep (one continuation, replayed per K): measured vs the cost model's E_K")
        sw.add_column("K", justify="right")
        for col in ("alpha", "AL measured", "AL predicted"):
            sw.add_column(col, justify="right")
        for k, v in prim["sweep"].items():
            sw.add_row(k, f"{v['alpha']:.3f}", f"{v['acceptance_length']:.2f}", f"{v['predicted_acceptance_length']:.2f}")
        con.print(sw)
    for p in [prim] + ([ref] if ref else []):
        if not p.get("chat_template", True):
            con.print(f"[yellow]warning:[/] {p['label']}: the tokenizer has no chat template; prompts were sent raw")
        for sk in p.get("skipped", []):
            con.print(f"[yellow]skipped[/] ({p['label']}): {sk}")
    for c in report.get("diagnostics", []):
        mark = "[green]ok[/]" if c["ok"] else "[red]PROBLEM[/]"
        con.print(f"{mark} {c['check']}: {c['detail']}", highlight=False)
    rec = report.get("recommendation")
    if rec:
        ev = rec["evidence"]
        mc = rec["max_concurrency"]
        con.print(f"recommendation for {ev['gpu']['name']} (TP{ev['tp']}): max_draft_len={rec['max_draft_len']}, "
                  + (f"speculation off above concurrency {mc}" if mc else "speculation does not pay at any batch size")
                  + f" (predicted speedup at batch {ev['chosen_at_concurrency']}: {ev['speedup_at_concurrency']:.2f}x)",
                  highlight=False)


def plot_report(report: dict, path: Path) -> None:
    """PNG: per-position acceptance (cumulative and conditional) and accepted-length histogram, per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = [report["pairs"]["bundle"]] + ([report["pairs"]["reference"]] if report["pairs"].get("reference") else [])
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = ["tab:blue", "tab:orange"]
    for p, col in zip(pairs, colors):
        o = p["overall"]
        ks = list(range(1, len(o["cumulative_acceptance"]) + 1))
        ax1.plot(ks, o["cumulative_acceptance"], "o-", color=col, label=f"{p['label']} cumulative")
        ax1.plot(ks, o["conditional_acceptance"], "s--", color=col, alpha=0.7, label=f"{p['label']} conditional")
    K = max(len(p["overall"]["cumulative_acceptance"]) for p in pairs)
    ax1.set_xticks(range(1, K + 1))
    ax1.set(xlabel="draft position k", ylabel="acceptance", ylim=(0, 1.02), title="per-position acceptance")
    ax1.legend(fontsize=7)
    width = 0.8 / len(pairs)
    for i, (p, col) in enumerate(zip(pairs, colors)):
        h = p["overall"]["accept_hist"]
        h = h + [0] * (K + 1 - len(h))
        tot = max(sum(h), 1)
        ax2.bar([a + 1 + (i - (len(pairs) - 1) / 2) * width for a in range(len(h))], [x / tot for x in h], width,
                color=col, label=p["label"])
    ax2.set_xticks(range(1, K + 2))
    ax2.set(xlabel="tokens per target forward (accepted + 1)", ylabel="fraction of iterations",
            title="acceptance length histogram")
    ax2.legend(fontsize=7)
    cats = list(pairs[0]["by_category"])
    for i, (p, col) in enumerate(zip(pairs, colors)):
        ax3.bar([j + (i - (len(pairs) - 1) / 2) * width for j in range(len(cats))],
                [p["by_category"].get(c, {}).get("alpha", 0) for c in cats], width, color=col, label=p["label"])
    ax3.set_xticks(range(len(cats)), cats, rotation=30, ha="right", fontsize=8)
    ax3.set(ylabel="alpha", ylim=(0, 1), title="alpha by category")
    ax3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
