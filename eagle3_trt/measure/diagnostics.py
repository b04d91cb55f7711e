"""Why is alpha low? Checks on the draft's predictions that name the usual causes.

The draft is judged by what alpha depends on: its *agreement* with the target (draft top-1 ==
the target's greedy token), per draft position, over the target's own greedy continuations.
Its confidence (mean top-1 probability) is not a verdict: a draft with a large vocabulary is
often flat but right (a healthy head on its own code traffic agrees with the target 71-77% of
the time at a mean top-1 probability of 0.13), and greedy chain drafting only uses the argmax.

Checks, each independent of the others' verdicts:

- ``draft_vocab_coverage``: share of the generated tokens the draft vocabulary can express;
- ``draft_agreement``: step-1 agreement (and steps 2..K, each fed the draft's own tokens);
- ``draft_confidence``: an info line, never a problem;
- ``d2t``: would another draft-to-target map explain the draft's top-1 much better? Fitted as a
  one-to-one relabeling on half the positions, scored on the other half, and compared with the
  same fit on random read-outs of the draft's own hidden states: a random head's top-1 is a
  hash of states that encode the next token, so it can be "relabeled" to some extent too; a
  trained head with shuffled labels is relabeled far better than any random read-out;
- ``aux_layers``: would other captured target layers explain the draft much better?
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle3_trt.measure.acceptance import Measurement
from eagle3_trt.measure.estimator import method_feed, teacher_forced_drafts

# Step-1 agreement below this: the draft rarely predicts the target's next token, and alpha is
# low whatever else is right (healthy EAGLE-3 heads agree 60-80% on their traffic).
AGREEMENT_FLOOR = 0.2
# Below this mean top-1 probability the confidence line says the draft is flat (info only).
FLAT_CONFIDENCE = 0.2
NULL_READOUTS = 3  # random read-outs the d2t relabeling is compared with
NULL_MARGIN = 0.15  # how much better than the best random read-out a relabeling must be


@dataclass
class DraftRun:
    """The draft's teacher-forced predictions over continuation positions (one target pass per sequence)."""

    pred: torch.Tensor  # [n] step-1 top-1 (draft ids)
    truth: torch.Tensor  # [n] the target token step 1 should predict
    features: torch.Tensor  # [n, H] step-1 input of the draft's lm_head (for random read-outs)
    step_agree: list[float]  # per draft step 1..k: top-1 (through d2t) == target token
    cross_entropy: float  # mean step-1 NLL of the true tokens that are in the draft vocabulary
    confidence: float  # mean step-1 top-1 probability


@torch.no_grad()
def draft_run(engine, seqs: list[list[int]], prompt_lens: list[int], k: int = 1) -> DraftRun:
    """Step s at origin p predicts token p+s+1; origins from the last prompt position on (the
    first continuation token is the target's own). Steps >= 2 are fed the draft's own tokens,
    as the runtime does."""
    d2t_ids = engine._d2t_ids
    t2d = torch.full((engine.target.vocab_size,), -1, dtype=torch.long)
    t2d[d2t_ids.cpu()] = torch.arange(d2t_ids.numel())
    preds, truth, feats, nll, conf = [], [], [], [], []
    hits, totals = [0] * k, [0] * k
    captured: list[torch.Tensor] = []
    # the lm_head's input at step 1 (its first call), whatever norm/variant the draft applies before it
    hook = engine.draft.lm_head.register_forward_hook(lambda mod, inp, out: captured.append(inp[0].detach()))
    try:
        for s, n0 in zip(seqs, prompt_lens):
            N = len(s)
            if N - n0 < 2:
                continue
            ids = torch.tensor([s])
            allowed = torch.tril(torch.ones(N, N, dtype=torch.bool))[None]
            _, aux = engine.target.forward(ids, torch.arange(N)[None], allowed, None, logits_at=torch.zeros(1, 1, dtype=torch.long))
            captured.clear()
            steps = teacher_forced_drafts(engine.draft, engine._draft_embed, aux, ids.to(engine.device), k, feed=method_feed(engine), d2t_ids=d2t_ids)
            lo = max(n0 - 1, 0)
            for st, lg in enumerate(steps, 1):
                lg = lg[0, lo : N - 1 - st].float().cpu()
                if not lg.shape[0]:
                    continue
                y = ids[0, lo + st + 1 : N]
                p = lg.argmax(-1)
                hits[st - 1] += int((d2t_ids.cpu()[p] == y).sum())
                totals[st - 1] += y.numel()
                if st == 1:
                    preds.append(p)
                    truth.append(y)
                    # (a head called some other way than through its module: read out its logits instead)
                    feats.append(captured[0][0, lo : N - 2].float().cpu() if captured else lg)
                    conf.append(torch.softmax(lg, -1).amax(-1))
                    d = t2d[y]
                    ok = d >= 0
                    if ok.any():
                        nll.append(-torch.log_softmax(lg[ok], -1).gather(-1, d[ok][:, None])[:, 0])
    finally:
        hook.remove()
    if not preds:
        z = torch.zeros(0, dtype=torch.long)
        return DraftRun(z, z, torch.zeros(0, 1), [0.0] * k, float("nan"), 0.0)
    return DraftRun(
        torch.cat(preds),
        torch.cat(truth),
        torch.cat(feats),
        [h / t if t else 0.0 for h, t in zip(hits, totals)],
        float(torch.cat(nll).mean()) if nll else float("nan"),
        float(torch.cat(conf).mean()),
    )


def relabel_score(pred: torch.Tensor, truth: torch.Tensor) -> tuple[float, int]:
    """Held-out agreement under the best one-to-one relabeling of draft ids, and how many ids it
    got right. Fitted greedily by co-occurrence counts on the even positions, scored on the odd
    ones (interleaved halves). One-to-one, as d2t is: a head whose top-1 is a hash of the state
    maps many ids onto the same frequent token, which a one-to-one map cannot keep."""
    fit_p, fit_y, ev_p, ev_y = pred[0::2], truth[0::2], pred[1::2], truth[1::2]
    pairs, counts = torch.stack([fit_p, fit_y]).unique(dim=1, return_counts=True)
    mapping: dict[int, int] = {}
    used: set[int] = set()
    for i in counts.argsort(descending=True, stable=True).tolist():
        a, t = int(pairs[0, i]), int(pairs[1, i])
        if a not in mapping and t not in used:
            mapping[a] = t
            used.add(t)
    mapped = torch.tensor([mapping.get(a, -1) for a in ev_p.tolist()], dtype=torch.long)
    hit = mapped == ev_y
    return float(hit.float().mean()) if hit.numel() else 0.0, len(set(ev_p[hit].tolist()))


def null_relabel_score(run: DraftRun, vocab: int, n: int = NULL_READOUTS) -> float:
    """The best ``relabel_score`` of ``n`` random linear read-outs (``vocab`` ids, as the draft's
    head) of the draft's own hidden states: what relabeling achieves without a trained head."""
    best = 0.0
    for seed in range(n):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(vocab, run.features.shape[-1], generator=g)
        best = max(best, relabel_score((run.features @ w.T).argmax(-1), run.truth)[0])
    return best


def diagnose(engine, m: Measurement, max_seqs: int = 16) -> list[dict]:
    """Checks that name the usual causes of a low alpha: wrong d2t, wrong aux layers, vocabulary coverage."""
    sample = m.results[:max_seqs]
    return diagnose_sequences(engine, [r.prompt_ids + r.continuation for r in sample], [len(r.prompt_ids) for r in sample])


def _pct(xs: list[float]) -> str:
    return "/".join(f"{x:.0%}" for x in xs)


def diagnose_sequences(engine, seqs: list[list[int]], prompt_lens: list[int]) -> list[dict]:
    d2t_ids = engine._d2t_ids.cpu()
    run = draft_run(engine, seqs, prompt_lens, k=max(int(engine.max_draft_len), 1))
    if run.truth.numel() < 8:
        return [{"check": "diagnostics", "ok": True, "detail": "too few generated tokens to diagnose"}]
    agree = run.step_agree[0]
    oracle, distinct, null, bad_map = _relabel_verdict(engine, run, d2t_ids)
    out = [
        _vocab_coverage_check(run.truth, d2t_ids),
        _agreement_check(run, bad_map),
        _confidence_check(run),
        _d2t_check(agree, oracle, null, distinct, bad_map),
    ]
    aux = _aux_layers_check(engine, seqs, prompt_lens, agree, run.cross_entropy)
    if aux is not None:
        out.append(aux)
    return out


def _vocab_coverage_check(y: torch.Tensor, d2t_ids: torch.Tensor) -> dict:
    in_vocab = torch.isin(y, d2t_ids)
    cov = float(in_vocab.float().mean())
    return {
        "check": "draft_vocab_coverage",
        "ok": cov >= 0.7,
        "value": cov,
        "detail": f"{cov:.0%} of the target's generated tokens are in the draft vocabulary"
        + ("" if cov >= 0.7 else " (acceptance is capped by this; the draft vocabulary does not fit this traffic)"),
    }


def _relabel_verdict(engine, run: DraftRun, d2t_ids: torch.Tensor) -> tuple[float, int, float, bool]:
    """(oracle score, distinct draft ids, null oracle score, whether d2t mislabels a trained head)."""
    pred, y = run.pred, run.truth
    # Would another draft->target map explain the draft's top-1 much better than d2t does, and
    # much better than a random read-out of the same states? Then the head is trained and its
    # labels are wrong. Independent of every other verdict.
    oracle, distinct = relabel_score(pred, y)
    null = null_relabel_score(run, int(engine.draft.config.draft_vocab_size))
    agree_ev = float((d2t_ids[pred[1::2]] == y[1::2]).float().mean())
    bad_map = oracle >= 0.3 and oracle >= 2 * agree_ev + 0.1 and oracle >= null + NULL_MARGIN and distinct >= 4
    return oracle, distinct, null, bad_map


def _agreement_check(run: DraftRun, bad_map: bool) -> dict:
    agree = run.step_agree[0]
    good = agree >= AGREEMENT_FLOOR
    return {
        "check": "draft_agreement",
        "ok": good,
        "value": agree,
        "per_position": run.step_agree,
        "detail": (
            f"draft top-1 equals the target's token {_pct(run.step_agree)} of the time at draft "
            f"positions 1..{len(run.step_agree)}"
            + (
                ""
                if good
                else (
                    " (explained by d2t below)"
                    if bad_map
                    else f" (below {AGREEMENT_FLOOR:.0%} at position 1: the draft is untrained, random, trained on "
                    "another target or other traffic, or fed hidden states it was not trained on)"
                )
            )
        ),
    }


def _confidence_check(run: DraftRun) -> dict:
    flat = run.confidence < FLAT_CONFIDENCE
    return {
        "check": "draft_confidence",
        "ok": True,
        "info": True,
        "value": run.confidence,
        "detail": f"draft step-1 mean top-1 probability {run.confidence:.2f}"
        + (" (flat; alpha depends on agreement, not confidence: greedy chain drafting uses the top-1 only)" if flat else ""),
    }


def _d2t_check(agree: float, oracle: float, null: float, distinct: int, bad_map: bool) -> dict:
    return {
        "check": "d2t",
        "ok": not bad_map,
        "value": agree,
        "oracle": oracle,
        "null_oracle": null,
        "detail": (
            f"draft step-1 top-1 matches the target {agree:.0%} of the time through d2t"
            + (
                f", but {oracle:.0%} under a one-to-one relabeling of {distinct} draft ids (random read-outs "
                f"of the same states: {null:.0%}): d2t does not match the draft's lm_head (shuffled, or from "
                "another draft vocabulary)"
                if bad_map
                else ""
            )
        ),
    }


def _aux_layer_scores(engine, seqs: list[list[int]], prompt_lens: list[int]) -> dict[str, tuple[tuple[int, ...], float, float]]:
    """{alternative name: (layer ids, step-1 agreement, cross entropy)} for each plausible other aux-layer choice."""
    # off-by-one conventions, order, non-default layers
    cur = tuple(engine.target.aux_layer_ids)
    L = engine.target.num_layers
    alts = {
        "TensorRT-LLM default": engine.target.family.default_aux_layers(L),
        "ids - 1": tuple(i - 1 for i in cur),
        "ids + 1": tuple(i + 1 for i in cur),
        "ascending order": tuple(sorted(cur)),
    }
    scores: dict[str, tuple[tuple[int, ...], float, float]] = {}
    for name, ids in alts.items():
        if ids == cur or ids in [v[0] for v in scores.values()] or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= L or len(ids) != len(cur):
            continue
        engine.target.aux_layer_ids = ids
        try:
            alt = draft_run(engine, seqs, prompt_lens, k=1)
        finally:
            engine.target.aux_layer_ids = cur
        scores[name] = (ids, alt.step_agree[0], alt.cross_entropy)
    return scores


def _aux_layers_check(engine, seqs: list[list[int]], prompt_lens: list[int], agree: float, ce: float) -> dict | None:
    """Would other aux layers explain the draft better? None when there is no alternative to try."""
    cur = tuple(engine.target.aux_layer_ids)
    scores = _aux_layer_scores(engine, seqs, prompt_lens)
    if not scores:
        return None
    name, (ids, sc, ce2) = max(scores.items(), key=lambda kv: (kv[1][1], -kv[1][2]))
    # flag a clearly better explanation: +10 points of top-1 agreement, or much lower loss and better agreement
    bad_aux = sc >= agree + 0.10 or (sc > agree and ce - ce2 >= 0.5)
    return {
        "check": "aux_layers",
        "ok": not bad_aux,
        "value": agree,
        "cross_entropy": ce,
        "alternatives": {n: {"ids": list(i), "agreement": s, "cross_entropy": c} for n, (i, s, c) in scores.items()},
        "detail": (
            f"captured layers {list(cur)}: step-1 agreement {agree:.0%}"
            + (
                f"; with layers {list(ids)} ({name}) it is {sc:.0%}: the draft was probably trained on "
                f"those (set eagle3_layers_to_capture / eagle_aux_hidden_state_layer_ids)"
                if bad_aux
                else f"; best alternative {list(ids)} ({name}) gives {sc:.0%}"
            )
        ),
    }
