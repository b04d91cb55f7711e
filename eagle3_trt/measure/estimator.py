"""The fast greedy acceptance (alpha) estimator.

It reproduces greedy chain speculative decoding exactly without running it:

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eagle3_trt.core import hf_compat
from eagle3_trt.core.engine import RequestResult, SamplingParams
from eagle3_trt.core.stats import RequestStats
from eagle3_trt.core.target import column_windows
from eagle3_trt.errors import UserError
from eagle3_trt.speculative.sa.automaton import SAConfig, SAEnhancer
from eagle3_trt.speculative.sa.method import sa_config_of


# ---------------------------------------------------------------------------------------------
# Batched multi-step drafting over whole sequences
# ---------------------------------------------------------------------------------------------
def teacher_forced_drafts(
    draft,
    embed_fn,
    aux: torch.Tensor,
    tokens: torch.Tensor,
    k: int,
    feed: str = "draft",
    d2t_ids: torch.Tensor | None = None,
    start: int = 0,
    starts: torch.Tensor | None = None,
    span: int | None = None,
):
    """Draft logits for steps 1..k at every origin position, in k batched passes.

    ``aux`` [B, >= N-1, A]: target aux states; ``tokens`` [B, N] target ids (right-padded; padding
    never influences valid positions because all attention is causal in the origin).
    Origin p pairs the state of position p with token p+1 (p = 0..N-2). Step s at origin p
    predicts token p+s+1. ``feed``: "draft" feeds step s the draft's own step s-1 prediction
    (what the runtime does), "truth" feeds the true token p+s (training-time test), or a method's
    callable ``(step s-1 logits, its hidden) -> (step s tokens, hidden)`` (``method_feed``: e.g. a
    method's mask slots, whose attention pattern is exactly this one: the context up to the origin plus the
    slots of the same origin).
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
        if callable(feed):  # a method's own later draft slots (method_feed)
            inp_tok, hidden = feed(prev, hidden)
        elif feed == "draft":
            inp_tok = d2t_ids[prev.argmax(-1)]
        else:
            shifted = tokens[:, start + s :]
            inp_tok = torch.cat([shifted, torch.zeros(B, Q - shifted.shape[1], dtype=tokens.dtype, device=dev)], dim=1)
        mask = torch.cat([ctx] + [diag] * (s - 1), dim=1)[None].expand(B, -1, -1)
        hidden, prev, kv = draft(embed_fn(inp_tok), hidden, pos[:, start:] + (s - 1), past=kv, mask=mask)
        outs.append(prev)
    return outs


def method_feed(engine) -> Any:
    """What the engine's method feeds draft steps >= 2 (``teacher_forced_drafts``' ``feed``): its
    class's ``teacher_forced_feed(draft)`` hook when it has one (e.g. mask slots), else "draft"
    (the chain feeds back its own prediction)."""
    hook = getattr(getattr(engine, "method", None), "teacher_forced_feed", None)
    return hook(engine.draft) if hook is not None else "draft"


def _draft_step1(draft, embed_fn, aux, tokens, d2t_ids, with_logits: bool = True):
    """Draft step 1 at every position in one causal pass (fc over the target's aux states)."""
    B, N = tokens.shape
    P = N - 1
    dev = aux.device
    if d2t_ids is None:
        d2t_ids = torch.arange(draft.config.draft_vocab_size, device=dev) + draft.d2t.to(dev)
    pos = torch.arange(P, device=dev)[None].expand(B, P)
    causal = torch.tril(torch.ones(P, P, dtype=torch.bool, device=dev))
    h, logits, kv = draft(embed_fn(tokens[:, 1:]), draft.fuse(aux[:, :P]), pos, past=None, mask=causal[None].expand(B, -1, -1), with_logits=with_logits)
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
        if callable(feed):  # a method's own later draft slots (method_feed)
            inp_tok, hidden = feed(prev, hidden)
        elif feed == "draft":
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
def walk_chain(
    seq: Sequence[int],
    prompt_len: int,
    preds: Sequence[Sequence[int]],
    k: int,
    max_tokens: int,
    max_seq_len: int,
    stop_ids: frozenset[int],
) -> RequestStats:
    """Stats of greedy chain speculation over a known greedy continuation.

    ``seq`` = prompt + continuation (as the runtime emitted it); ``preds[s-1][p]`` = draft step s
    prediction (target id) at origin p.
    """
    return walk_chain_batch([(seq, prompt_len, preds)], k, max_tokens, max_seq_len, stop_ids)[0]


def walk_chain_batch(
    batch: Sequence[tuple[Sequence[int], int, Sequence[Sequence[int]]]],
    k: int,
    max_tokens: int,
    max_seq_len: int,
    stop_ids: frozenset[int],
    sa: SAConfig | None = None,
) -> list[RequestStats]:
    """Stats of greedy chain speculation for one batch of requests (``(seq, prompt_len, preds)``
    each, as ``walk_chain``), replayed in lockstep as ``SpeculativeEngine.generate`` runs the batch.

    ``sa``: TensorRT-LLM's suffix-automaton enhancer as the engine applies it (speculative/sa/automaton.py
    ``SAEnhancer``): after each decode step the rows that were decoding extend their automata with the
    tokens they accepted, in batch order (their position indexes the draft buffer, whose stale slots
    are verified too), and their next drafts are the automaton's when the match reaches the
    threshold; the first decode's drafts are always neural. Greedy output does not depend on the
    drafts, so every row's text at every step is the one generation produces: the counts are exact,
    the global pool's cross-request search included (the other rows' automata as they stand then).
    """
    stats = [RequestStats(speculation=True) for _ in batch]
    enh = SAEnhancer(sa, [seq[:pl] for seq, pl, _ in batch], k) if sa is not None else None
    g = [0] * len(batch)  # tokens emitted
    r = [0] * len(batch)  # position of the root (last emitted token)
    live: list[int] = []
    for b, (seq, pl, _) in enumerate(batch):
        if len(seq) - pl > 0:
            stats[b].target_forwards, stats[b].generated_tokens = 1, 1
            g[b], r[b] = 1, pl
            if len(seq) - pl > 1:
                live.append(b)
    while live:
        accepted: dict[int, list[int]] = {}
        for b in live:
            seq, pl, preds = batch[b]
            cont, end, st = len(seq) - pl, len(seq) - 1, stats[b]
            kk = max(0, min(k, max_tokens - g[b] - 1, max_seq_len - (pl + g[b]) - 1))
            draft = [preds[s][r[b] - 1] for s in range(kk)]
            sa_draft = enh.drafts(b) if enh is not None and kk > 0 else None
            if sa_draft is not None:
                draft = sa_draft[:kk]
            a = 0
            while a < kk and r[b] + a + 1 <= end and draft[a] == seq[r[b] + a + 1]:
                a += 1
                if seq[r[b] + a] in stop_ids:
                    break
            stopped = a > 0 and seq[r[b] + a] in stop_ids
            if kk > 0:
                st.record_iteration(kk, a if stopped else min(a + 1, kk), a)
            st.target_forwards += 1
            st.generated_tokens += min(a + 1, cont - g[b])
            accepted[b] = list(seq[r[b] + 1 : r[b] + a + 1 + (0 if stopped else 1)])
            g[b] += a + 1
            r[b] += a + 1
        if enh is not None:
            enh.update(live, accepted)
        live = [b for b in live if g[b] < len(batch[b][0]) - batch[b][1]]
    return stats


@dataclass
class EstimateResult:
    stats: list[RequestStats]  # at the engine's (or the requested) K
    continuations: list[list[int]]
    finish_reasons: list[str | None]
    by_k: dict[int, list[RequestStats]] = field(default_factory=dict)  # every K measured (``sweep`` adds more)


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


class _GreedyRows:
    """Per-row state of ``greedy_continuations``: tokens so far, finish reasons, aux states."""

    def __init__(self, engine, prompts: list[list[int]], max_tokens: int, stop: frozenset[int]) -> None:
        self.lens = [len(p) for p in prompts]
        self.tokens = [list(p) for p in prompts]
        self.finished = [False] * len(prompts)
        self.reasons: list[str | None] = [None] * len(prompts)
        self.aux_rows: list[list[torch.Tensor]] = [[] for _ in prompts]
        self.stop, self.max_tokens, self.max_seq_len = stop, max_tokens, engine.max_seq_len
        self.on_token: Callable[[int, int], None] | None = None  # progress: (prompts done, tokens) per token

    def emit(self, b: int, tok: int) -> None:
        self.tokens[b].append(tok)
        if self.on_token is not None:
            self.on_token(0, 1)
        if tok in self.stop:
            self.finished[b], self.reasons[b] = True, "stop"
        elif len(self.tokens[b]) - self.lens[b] >= self.max_tokens or len(self.tokens[b]) >= self.max_seq_len:
            self.finished[b], self.reasons[b] = True, "length"


@torch.inference_mode()
def greedy_continuations(engine, prompts: list[list[int]], max_tokens: int, on_token: Callable[[int, int], None] | None = None):
    """What ``engine.generate_with_aux(prompts, greedy max_tokens)`` returns, computed faster.

    ``on_token``: called ``(0, 1)`` per generated token (the commands' progress display).

    Same target passes (a prefill, then one pass per generated token) and the same stopping
    rules, but: prompts (ascending length) are prefilled in groups of similar length, so the
    O(S^2) prefill is not padded to the longest prompt of the batch; the groups' KV caches are
    then merged (left-padded, as the engine lays them out) into one preallocated cache for a
    single batched decode (appends write in place instead of concatenating), so the number of
    sequential target passes stays max_tokens; rows that finish leave the batch; no per-row
    engine bookkeeping. Returns (results, aux states) like generate_with_aux. Falls back to
    ``generate_with_aux`` for invalid prompts, which the engine reports.
    """
    tgt = engine.target
    params = SamplingParams(max_tokens=max_tokens)
    V = tgt.vocab_size
    if max_tokens == 0 or not prompts or any(not p or len(p) >= engine.max_seq_len or min(p) < 0 or max(p) >= V for p in prompts):
        return engine.generate_with_aux(prompts, params)
    B = len(prompts)
    lens = [len(p) for p in prompts]
    if lens != sorted(lens):  # the merged cache is laid out by ascending length
        order = sorted(range(B), key=lambda i: lens[i])
        res, auxs = greedy_continuations(engine, [prompts[i] for i in order], max_tokens, on_token)
        back = {i: r for r, i in enumerate(order)}
        return [res[back[i]] for i in range(B)], [auxs[back[i]] for i in range(B)]
    S = lens[-1]
    rows = _GreedyRows(engine, prompts, max_tokens, frozenset(engine.eos_token_ids) | frozenset(params.stop_token_ids))
    rows.on_token = on_token
    kv = _prefill_groups(engine, prompts, rows)
    if kv is None:
        return engine.generate_with_aux(prompts, params)
    # merge the groups' caches into one left-padded cache with room for the decode; only kv refers
    # to the groups' K/V now, and the merge releases them layer by layer
    steps = min(max_tokens, engine.max_seq_len - lens[0])  # decode passes at most (lens ascend)
    cache = tgt.preallocated_cache([(ks, vs) for ks, vs, _ in kv], S + steps)
    del kv
    _batched_decode(tgt, rows, cache, S)
    tokens = rows.tokens
    # target alone: no drafts to count (callers read the tokens and finish reasons only)
    res = [RequestResult(t[lens[b] :], rows.reasons[b], RequestStats(generated_tokens=len(t) - lens[b], speculation=False)) for b, t in enumerate(tokens)]
    return res, [torch.cat(rows.aux_rows[b])[: len(tokens[b]) - 1] for b in range(B)]


def _prefill_groups(engine, prompts: list[list[int]], rows: _GreedyRows) -> list[tuple[list[torch.Tensor], list[torch.Tensor], int]] | None:
    """Prefill per group of similar lengths and emit each row's first token; returns each group's
    (keys per layer, values per layer, width), or None when the cache's layers cannot be read."""
    tgt, pad, lens = engine.target, engine.pad_token_id, rows.lens
    kv: list[tuple[list[torch.Tensor], list[torch.Tensor], int]] = []
    for g in _length_buckets(lens):
        Sg = lens[g[-1]]
        ids = torch.full((len(g), Sg), pad, dtype=torch.long)
        valid = torch.zeros(len(g), Sg, dtype=torch.bool)
        for r, b in enumerate(g):
            ids[r, Sg - lens[b] :] = torch.tensor(prompts[b])
            valid[r, Sg - lens[b] :] = True
        pos = (valid.cumsum(-1) - 1).clamp(min=0)
        allowed = torch.tril(torch.ones(Sg, Sg, dtype=torch.bool))[None] & valid[:, None, :]
        allowed |= torch.eye(Sg, dtype=torch.bool)[None]
        cache = tgt.new_cache()
        logits, aux = tgt.forward(ids, pos, allowed, cache, logits_at=torch.full((len(g), 1), Sg - 1))
        layers = hf_compat.cache_layers(cache)
        if layers is None:
            return None
        kv.append(([lay.keys for lay in layers], [lay.values for lay in layers], Sg))
        first = logits[:, 0].argmax(-1).tolist()
        for r, b in enumerate(g):
            rows.aux_rows[b].append(aux[r, Sg - lens[b] :])
            rows.emit(b, first[r])
    return kv


def _batched_decode(tgt, rows: _GreedyRows, cache, S: int) -> None:
    """Batched greedy decode into ``cache`` (left-padded to ``S``); rows that finished leave the batch."""
    lens, tokens, finished = rows.lens, rows.tokens, rows.finished
    cols = torch.arange(S)
    t_valid = cols[None, :] >= (S - torch.tensor(lens))[:, None]  # [B, S]
    live = [b for b in range(len(lens)) if not finished[b]]
    if len(live) < len(lens):
        keep = torch.tensor(live, dtype=torch.long)
        cache.keep_rows(keep)
        t_valid = t_valid[keep]
    windows = None
    while live:
        n = len(live)
        if windows is None:  # attention per run of similar lengths skips the others' left padding
            windows = [(w[0], w[-1] + 1, S - lens[live[w[-1]]]) for w in _length_buckets([lens[b] for b in live], WINDOW_RATIO, WINDOW_MIN_PAD)]
        ids = torch.tensor([[tokens[b][-1]] for b in live])
        pos = torch.tensor([[len(tokens[b]) - 1] for b in live])
        allowed = torch.cat([t_valid[:, None, :], torch.ones(n, 1, 1, dtype=torch.bool)], dim=-1)
        with column_windows(windows):
            logits, aux = tgt.forward(ids, pos, allowed, cache)
        nxt = logits[:, 0].argmax(-1).tolist()
        for r, b in enumerate(live):
            rows.aux_rows[b].append(aux[r, :1])
            rows.emit(b, nxt[r])
        t_valid = torch.cat([t_valid, torch.ones(n, 1, dtype=torch.bool)], dim=1)
        still = [r for r, b in enumerate(live) if not finished[b]]
        if len(still) < n and still:
            keep = torch.tensor(still, dtype=torch.long)
            cache.keep_rows(keep)
            t_valid = t_valid[keep]
            windows = None
        live = [live[r] for r in still]


@torch.inference_mode()
def estimate(
    engine,
    prompts: list[list[int]],
    max_tokens: int,
    k: int | None = None,
    batch_size: int = 16,
    sweep: Sequence[int] = (),
    tick: Callable[[int, int], None] | None = None,
) -> EstimateResult:
    """Greedy chain acceptance of ``engine``'s draft on ``prompts``, identical to running it
    (with the engine's method the SA enhancer, speculative/sa: the chain with TensorRT-LLM's suffix-automaton enhancer, replayed per
    batch of ``batch_size`` prompts in their given order, as ``measure/acceptance.py`` generates them:
    see ``walk_chain_batch``).

    The target runs once, without speculation, batched over prompts; the aux states it produced
    for every token are kept and the draft's K steps run over them for all positions at once.

    ``sweep``: further draft lengths to replay (``EstimateResult.by_k``). Neither the target's
    greedy continuation nor the draft's step-s prediction at a position depends on K, so every
    K up to the largest costs one more replay walk, where measuring by generation costs one
    more run per K.

    ``tick(prompts, tokens)``: progress, per generated token and per batch of prompts continued.
    """
    k = engine.max_draft_len if k is None else int(k)
    if engine.draft is None:
        raise UserError("draft", "the engine has no draft", "load a bundle or pair with a draft")
    ks = sorted({k, *(int(x) for x in sweep)})
    if ks[0] < 1:
        raise UserError("max_draft_len", f"{ks[0]}", "measure with K >= 1")
    k_max = ks[-1]
    sa = sa_config_of(getattr(engine, "method", None))  # TensorRT-LLM's sa_config, as the engine would apply it
    walked: dict[int, tuple[list[int], int, list[list[int]]]] = {}  # with sa: replayed per batch after drafting
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    conts: list[list[int]] = [[] for _ in prompts]
    reasons: list[str | None] = [None] * len(prompts)
    by_k: dict[int, list[RequestStats]] = {kk: [RequestStats() for _ in prompts] for kk in ks}
    stop = frozenset(engine.eos_token_ids)
    dev = engine.device
    d2t_ids = engine._d2t_ids
    feed = method_feed(engine)
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        res, auxs = greedy_continuations(engine, [prompts[j] for j in idx], max_tokens, tick)
        if tick is not None:
            tick(len(idx), 0)
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
            logits = teacher_forced_drafts(
                engine.draft, engine._draft_embed, aux, ids.to(dev), k_max, feed=feed, d2t_ids=d2t_ids, starts=torch.tensor(starts), span=span
            )
            steps = [d2t_ids[lg.argmax(-1)].cpu() for lg in logits]
            for r, b in enumerate(grp):
                j = idx[b]
                preds = [[-1] * starts[r] + p[r].tolist() for p in steps]
                if sa is not None:
                    walked[j] = (seqs[b], len(prompts[j]), preds)
                    continue
                for kk in ks:
                    by_k[kk][j] = walk_chain(seqs[b], len(prompts[j]), preds, kk, max_tokens, engine.max_seq_len, stop)
    if sa is not None:
        for s0 in range(0, len(prompts), batch_size):
            part = [j for j in range(s0, min(s0 + batch_size, len(prompts))) if j in walked]
            for kk in ks:
                for j, st in zip(part, walk_chain_batch([walked[j] for j in part], kk, max_tokens, engine.max_seq_len, stop, sa)):
                    by_k[kk][j] = st
    return EstimateResult(by_k[k], conts, reasons, by_k)
