"""Why is alpha low? Checks on the draft's first step that name the usual causes.

Each check scores the draft's step-1 predictions over the target's own greedy continuations:
draft-vocabulary coverage of the generated tokens, the draft's confidence, whether another
draft-to-target map (d2t) or other captured aux layers would explain its predictions much better.
"""

from __future__ import annotations

import torch

from eagle3_trt.convert.target import default_aux_layers
from eagle3_trt.runtime.estimator import teacher_forced_drafts
from eagle3_trt.runtime.measure import Measurement


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
    alts = {"TensorRT-LLM default": default_aux_layers(L), "ids - 1": tuple(i - 1 for i in cur),
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
