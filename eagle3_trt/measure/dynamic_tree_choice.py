"""``recommend --write``: TensorRT-LLM's dynamic tree (``use_dynamic_tree``) or the chain, chosen by
the cost model at the bundle's expected concurrency from an alpha report measured with
``--modes chain,dynamic-tree``.

Both modes are costed with the cost model's per-forward roofline (``cost_model.forward_time_s``),
each through its registered cost hook (speculative/<method>/cost.py ``step_seconds``, via
``cost_model.predict_from_tokens``), and predicted as S = AL * T_base / T_iter, AL the measured tokens
per target forward of the mode:

- chain (as ``cost_model.predict``): T_iter = target forward over b * (K + 1) tokens + draft step 1
  over the b * AL newly accepted tokens + (K - 1) draft forwards over b tokens;
- dynamic tree: T_iter = target forward over b * (N + 1) tokens (N = max_total_draft_tokens: the
  verification cost grows with the tokens verified) + draft step 0 over b * (K + 1) tokens (TensorRT-LLM
  re-packs every request to max_draft_len + 1 tokens, ``_gather_repack_step0_kernel``) + draft
  layer i = 1..K-1 over b * i * topK tokens (its draft loop re-runs every expanded node each layer, a
  growing context: ``_forward_draft_loop`` in tensorrt_llm/_torch/speculative/eagle3_dynamic_tree.py
  @057c8a65).

The tree is written when its predicted speedup at the concurrency beats the chain's (and SA's, when
measured) by DT_MIN_GAIN_REL; then draft_len_schedule only switches speculation off above the largest
batch size at which the tree still pays (dynamic draft length is for linear trees only) and the
acceptance-rate gate is the tree's own (measure/method_gate.py: its break-even acceptance, replayed on
its measured turns). Otherwise the three keys are removed.
"""

from __future__ import annotations

from types import SimpleNamespace

from eagle3_trt.formats.alpha_report import AlphaReport
from eagle3_trt.measure.bundle_costs import bundle_cost_inputs, recommendation_batches
from eagle3_trt.measure.cost_model import CostParams, Recommendation, model_costs, predict_from_tokens
from eagle3_trt.pipeline.bundle import Bundle

DT_MIN_GAIN_REL = 0.03  # predicted speedup gain over the chain beyond run-to-run noise in AL
DT_KEYS = ("use_dynamic_tree", "dynamic_tree_max_topK", "max_total_draft_tokens")


def bundle_inputs(b: Bundle, rec: Recommendation) -> tuple[dict, list[int]]:
    """(``cost_model.recommend``'s cost inputs for the GPU and TP ``rec`` was predicted for, the batch sizes)."""
    costs = bundle_cost_inputs(b, gpu=(rec.evidence.get("gpu") or {}).get("name"), tp=rec.evidence.get("tp"))
    return costs, list(recommendation_batches(b))


def mode_speedups(costs: dict, k: int, al: dict[str, float], tree: dict, batches: list[int], params: CostParams | None = None) -> dict:
    """{mode: {batch: predicted speedup}} for "chain", "sa" and "dynamic-tree", each mode's iteration priced
    by its registered cost hook (``cost_model.predict_from_tokens``; the tree's shape from ``tree``)."""
    gpu, tp, tcost, dcost = model_costs(costs)
    params = params or CostParams()
    shape = SimpleNamespace(dynamic_tree_max_topK=tree["dynamic_tree_max_topK"], max_total_draft_tokens=tree["max_total_draft_tokens"], max_draft_len=k)
    return {
        mode: {bs: predict_from_tokens(e, gpu, tcost, dcost, tp, bs, k, params, method=mode, options=shape).speedup for bs in batches} for mode, e in al.items()
    }


def dynamic_tree_choice(report: AlphaReport, rec: Recommendation, costs: dict, batch_sizes: list[int]) -> tuple[dict, dict | None]:
    """(speculative_config fields: the three dynamic-tree keys, all None unless the tree wins, plus
    ``max_draft_len`` (the tree's depth, which may differ from the chain K ``rec`` chose) and
    ``draft_len_schedule`` when it wins; the evidence, None when the report did not measure both
    chain and dynamic-tree)."""
    cleared: dict = dict.fromkeys(DT_KEYS)
    modes = report.modes or {}
    chain, dyn = modes.get("chain"), modes.get("dynamic-tree")
    if chain is None or dyn is None or dyn.dynamic_tree is None:
        return cleared, None
    tree, conc = dyn.dynamic_tree.model_dump(), int(rec.evidence.get("chosen_at_concurrency", 1))  # the record, in TensorRT-LLM's names
    k = int(tree["max_draft_len"])  # the tree's depth; the chain mode was measured at the same K
    ev: dict = {
        "prompts": report.settings.prompts,
        "turns": dyn.overall.requests,
        "dynamic_tree": tree,
        "chain_acceptance_length": round(chain.overall.acceptance_length, 4),
        "dynamic_tree_acceptance_length": round(dyn.overall.acceptance_length, 4),
        "dynamic_tree_tokens_verified_per_forward": round(dyn.overall.tokens_verified_per_forward, 4),
        "concurrency": conc,
        "rule": f"written when the predicted speedup at the concurrency beats the chain's (and sa's) by >= {DT_MIN_GAIN_REL:.0%}",
        "written": False,
    }
    if report.settings.max_draft_len != k:
        ev["reason"] = f"the chain and the tree (max_draft_len {k}) were not measured at the same K"
        return cleared, ev
    al = {"chain": chain.overall.acceptance_length, "dynamic-tree": dyn.overall.acceptance_length}
    if "sa" in modes:
        al["sa"] = modes["sa"].overall.acceptance_length
    batches = sorted(set(batch_sizes) | {conc})
    s = mode_speedups(costs, k, al, tree, batches)
    ev["predicted_speedup_by_batch"] = {m: {str(bs): round(v, 4) for bs, v in by.items()} for m, by in s.items()}
    best_other = max(v[conc] for m, v in s.items() if m != "dynamic-tree")
    if rec.max_draft_len != k:
        # the chain at the K the recommendation chose (its own prediction, from the same cost model)
        row = [r for r in rec.table if int(r["k"]) == rec.max_draft_len and int(r["batch"]) == conc]
        if row:
            ev["chain_at_recommended_k"] = {"k": rec.max_draft_len, "speedup": round(float(row[0]["speedup"]), 4)}
            best_other = max(best_other, float(row[0]["speedup"]))
    wins = s["dynamic-tree"][conc] >= best_other * (1 + DT_MIN_GAIN_REL) and s["dynamic-tree"][conc] > 1.0
    ev["written"] = wins
    if not wins:
        return cleared, ev
    mc = 0
    for bs in batches:  # the tree keeps its depth: speculation on up to the last batch size where it pays
        if s["dynamic-tree"][bs] < 1.0:
            break
        mc = bs
    mc = mc or conc
    ev["max_concurrency"] = mc
    fields = {
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": int(tree["dynamic_tree_max_topK"]),
        "max_total_draft_tokens": int(tree["max_total_draft_tokens"]),
    }
    return {**fields, "max_draft_len": k, "draft_len_schedule": {mc: k}}, ev


def dynamic_tree_summary(report: AlphaReport, rec: Recommendation, b: Bundle) -> str | None:
    """``recommend``'s line on the dynamic tree (its evidence goes into ``rec.evidence``); None when
    the report did not measure both chain and dynamic-tree."""
    _, ev = dynamic_tree_choice(report, rec, *bundle_inputs(b, rec))
    if ev is None:
        return None
    rec.evidence["dynamic_tree"] = ev
    if "reason" in ev:
        return f"dynamic tree: not compared ({ev['reason']})"
    conc, s = str(ev["concurrency"]), ev["predicted_speedup_by_batch"]
    t = ev["dynamic_tree"]
    return (
        f"dynamic tree (topK {t['dynamic_tree_max_topK']}, {t['max_total_draft_tokens']} nodes): AL {ev['dynamic_tree_acceptance_length']:.2f} vs chain "
        f"{ev['chain_acceptance_length']:.2f}, predicted speedup at concurrency {conc} {s['dynamic-tree'][conc]:.2f}x vs {s['chain'][conc]:.2f}x"
        + (f" (chain at the recommended K={r['k']}: {r['speedup']:.2f}x)" if (r := ev.get("chain_at_recommended_k")) else "")
        + ": "
        + (f"wins (recommend --write writes use_dynamic_tree at max_draft_len {t['max_draft_len']})" if ev["written"] else "the chain stays")
    )
