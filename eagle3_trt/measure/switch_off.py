"""Where speculation stops paying by context length, and whether any TensorRT-LLM setting can act on it.

Per context bucket (``measure/context_buckets.py``: the measured verifications at the chosen K, by
tokens of context), the cost model (``measure/cost_model.py``) prices one iteration at the chosen
concurrency with that bucket's context (KV read per sequence) and acceptance: without speculation
T_base(ctx) per token, with it T_spec(ctx) per AL tokens, so the bucket pays while its measured AL
exceeds the break-even AL = T_spec / T_base. Speculation "stops paying past N tokens" when every
measured bucket from N on is below break-even.

What TensorRT-LLM can do about it (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py @0004396720054fd8,
``DecodingBaseConfig``; the releases per speculative/release_keys.py and pipeline/trtllm_versions.py):
``max_concurrency`` and ``draft_len_schedule`` act on the batch size (1.3.0rc0+ on the one-model path,
PR #10860); ``acceptance_rate_window_size`` / ``acceptance_rate_threshold`` switch speculation off for
good, for the whole server, once the rolling acceptance rate over the last N speculating iterations
falls below the threshold (1.3.0rc0+, PR #12905; 1.2's ``acceptance_window`` /
``acceptance_length_threshold`` gated the rolling acceptance length over the last N completed
requests, on the two-model path only: an earlier stored llm_args.py, search index id 1090804222). The per-iteration
decision, ``Drafter.should_use_spec_decode`` (tensorrt_llm/_torch/speculative/drafter.py, read through
the search index), looks at ``max_concurrency``, the number of requests and ``max_num_tokens`` only. None
of them reads a request's context length: there is no per-request or per-position switch
(``NO_CONTEXT_SETTING``).

The closest setting is the acceptance-rate switch-off, and whether it helps is measured, not assumed
(``replay_switch_off``): the measured requests are replayed through TensorRT-LLM's rule the way
``measure/gate_replay.py`` replays them (``concurrency`` lanes, requests drawn with replacement,
back to back; one sample per iteration that drafted; off from two iterations after the tripping
sample, the overlap scheduler's delay, core/speculation_control.py), and each replay is priced with
the cost model per iteration at its lanes' context: with the gate, every token after the switch-off
costs T_base(ctx) / concurrency instead of its share of T_spec(ctx). It is written only when it saves
time in at least 97.5% of replays and by at least ``MIN_GAIN`` on average.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from eagle3_trt.formats.alpha_report import AlphaReport, report_json
from eagle3_trt.measure.context_buckets import Step, all_steps, bucket_labels, check_edges, context_table
from eagle3_trt.measure.cost_model import CostParams, recommend
from eagle3_trt.measure.gate_replay import HORIZON_REQUESTS, WINDOWS, first_trip, replay_lanes

NO_CONTEXT_SETTING = (
    "TensorRT-LLM has no setting that switches speculation off by context length: its switches act on the batch size "
    "(max_concurrency, draft_len_schedule) and on the server-wide rolling acceptance rate (acceptance_rate_window_size/"
    "acceptance_rate_threshold) (DecodingBaseConfig, tensorrt_llm/llmapi/llm_args.py @0004396)"
)
SWITCH_REPLAYS = 200
MIN_GAIN = 0.01  # mean time saved by the switch-off, as a fraction of the time without it
DEFAULT_PARAMS = CostParams()
OVERLAP_DELAY = 2  # iterations from the tripping sample to the first without drafts (overlap scheduler)
CONTEXT_GRID = (128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384)  # contexts the cost model is evaluated at


@dataclass(frozen=True)
class BucketVerdict:
    bucket: str
    mean_context: float
    forwards: int
    acceptance_length: float
    alpha: float
    break_even_al: float
    speedup: float

    @property
    def pays(self) -> bool:
        return self.speedup >= 1.0


def _costs_at(cum: list[float], k: int, concurrency: int, ctx: float, costs: dict, params: CostParams) -> tuple[float, float, float]:
    """(T_base, T_spec, E_K) in seconds at ``ctx`` tokens of context per sequence, from the cost model's own table."""
    curve = (list(cum) + [0.0] * k)[:k]
    rec = recommend(curve, concurrency=concurrency, batches=(concurrency,), max_k=k, params=replace(params, context_len=max(1, int(round(ctx)))), **costs)
    row = next(r for r in rec.table if int(r["k"]) == k and int(r["batch"]) == concurrency)
    return row["t_base_us"] * 1e-6, row["t_spec_us"] * 1e-6, float(row["tokens_per_iteration"])


def bucket_verdicts(rows: list[dict], k: int, concurrency: int, costs: dict, params: CostParams = DEFAULT_PARAMS) -> list[BucketVerdict]:
    """Per bucket row (``BucketTable.to_dict()["rows"]``) that verified drafts: measured AL against the
    break-even AL at its mean context and the concurrency, and the predicted speedup AL * T_base / T_spec."""
    out = []
    for r in rows:
        if not r["draft_tokens"]:
            continue
        t_base, t_spec, _ = _costs_at(r["cumulative_acceptance"], k, concurrency, r["mean_context"], costs, params)
        al = float(r["acceptance_length"])
        out.append(BucketVerdict(r["bucket"], float(r["mean_context"]), int(r["forwards"]), al, float(r["alpha"]), t_spec / t_base, al * t_base / t_spec))
    return out


def stops_paying(verdicts: list[BucketVerdict], edges: tuple[int, ...]) -> tuple[int | None, str]:
    """(index in ``verdicts`` of the first bucket from which no measured bucket pays, or None, and the line saying so)."""
    if not verdicts:
        return None, "no context bucket verified drafts"
    if all(v.pays for v in verdicts):
        where = verdicts[0].bucket if len(verdicts) == 1 else f"{verdicts[0].bucket} to {verdicts[-1].bucket}"
        return None, f"speculation pays in every measured context bucket ({where}; lowest predicted speedup {min(v.speedup for v in verdicts):.2f}x)"
    first_bad = next(i for i in range(len(verdicts)) if all(not v.pays for v in verdicts[i:]))
    v = verdicts[first_bad]
    lo = ([0, *edges])[bucket_labels(edges).index(v.bucket)]
    why = f"bucket {v.bucket}: AL {v.acceptance_length:.2f} below break-even {v.break_even_al:.2f}, predicted speedup {v.speedup:.2f}x"
    if first_bad == 0:
        return 0, f"speculation does not pay in any measured context bucket ({why})"
    if not all(x.pays for x in verdicts[:first_bad]):
        why += "; some shorter buckets do not pay either"
    return first_bad, f"speculation stops paying past {lo} tokens of context ({why})"


def _grid_costs(cum: list[float], k: int, concurrency: int, costs: dict, params: CostParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ctx = np.array(CONTEXT_GRID, dtype=np.float64)
    vals = [_costs_at(cum, k, concurrency, c, costs, params) for c in CONTEXT_GRID]
    return ctx, np.array([v[0] for v in vals]), np.array([v[1] for v in vals])


def replay_switch_off(
    per_request: list[tuple[list[Step], int]],
    k: int,
    concurrency: int,
    threshold: float,
    cost_grid: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    windows: tuple[int, ...] = WINDOWS,
    replays: int = SWITCH_REPLAYS,
    seed: int = 0,
) -> dict[int, dict]:
    """Per window: the time the acceptance-rate switch-off saves over speculation always on (fraction
    of the always-on time; negative: it costs), over ``replays`` replays (module docstring)."""
    seqs = [(s, p) for s, p in per_request if s]
    if len(seqs) < 2:
        return {}
    lengths = np.array([1 + len(s) for s, _ in seqs])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    # per iteration of each request: the prefill (drafts nothing, emits one token, context = prompt), then its steps
    drafted = np.array([x for s, _ in seqs for x in (0, *(st.drafted for st in s))], dtype=np.float64)
    accepted = np.array([x for s, _ in seqs for x in (0, *(st.accepted for st in s))], dtype=np.float64)
    tokens = np.array([x for s, _ in seqs for x in (1, *(st.tokens for st in s))], dtype=np.float64)
    context = np.array([x for s, p in seqs for x in (p, *(st.context for st in s))], dtype=np.float64)
    grid_ctx, t_base, t_spec = cost_grid
    rng = np.random.default_rng(seed)
    saved: dict[int, list[float]] = {w: [] for w in windows}
    trips: dict[int, int] = dict.fromkeys(windows, 0)
    for _ in range(replays):
        d, a, tok, ctx = replay_lanes(np.stack([drafted, accepted, tokens, context]), starts, lengths, concurrency, HORIZON_REQUESTS, rng)
        dd, aa = d.sum(0), a.sum(0)
        keep = np.flatnonzero(dd > 0)
        rates = aa[keep] / dd[keep]
        c = ctx.mean(0)
        spec_cost = np.interp(c, grid_ctx, t_spec)
        base_cost_per_token = np.interp(c, grid_ctx, t_base) / concurrency
        toks = tok.sum(0)
        t_on = float(spec_cost.sum())
        for w in windows:
            i = first_trip(rates, w, threshold)
            if i is None:
                saved[w].append(0.0)
                continue
            trips[w] += 1
            off = int(keep[i]) + OVERLAP_DELAY
            t_gate = float(spec_cost[:off].sum() + (toks[off:] * base_cost_per_token[off:]).sum())
            saved[w].append(1.0 - t_gate / t_on)
    out = {}
    for w in windows:
        s = np.array(saved[w])
        out[w] = {
            "mean_saved": float(s.mean()),
            "ci95": [float(np.percentile(s, 2.5)), float(np.percentile(s, 97.5))],
            "switched_off": trips[w],
            "replays": replays,
        }
    return out


def context_switch_off(report: dict | AlphaReport, k: int, concurrency: int, costs: dict, params: CostParams = DEFAULT_PARAMS) -> dict:
    """``recommend``'s evidence on context length at K and the concurrency: the bucket verdicts, where
    speculation stops paying, that no TensorRT-LLM setting acts on context length, and the replayed
    acceptance-rate switch-off (``written`` with its window and threshold only when it helps).
    ``report``: the report.json dict, or the typed report (formats/alpha_report.py)."""
    if isinstance(report, AlphaReport):
        report = report_json(report)
    ctx_rep = report.get("acceptance_by_context") or {}
    settings = report.get("settings", {})
    max_seq_len = ctx_rep.get("max_seq_len")
    reqs = (report.get("pairs", {}).get("bundle", {}) or {}).get("requests") or []
    base = {"k": k, "concurrency": concurrency, "setting": NO_CONTEXT_SETTING, "written": False}
    if max_seq_len is None or not reqs:
        return {**base, "lines": ["acceptance by context: the alpha report holds none (measure it again with this version)"]}
    edges = check_edges(ctx_rep.get("edges") or ctx_rep.get("by_context", {}).get("edges") or ())
    per_request, unmatched = all_steps(reqs, k, int(settings["max_tokens"]), int(max_seq_len), run_k=settings.get("max_draft_len"))
    if not per_request:
        return {**base, "lines": [f"acceptance by context: the alpha report holds no per-verification acceptance at K={k} (measure alpha --sweep {k})"]}
    rows = context_table(per_request, edges).to_dict()["rows"]  # the table alpha prints, at the chosen K
    verdicts = bucket_verdicts(rows, k, concurrency, costs, params)
    first_bad, stop_line = stops_paying(verdicts, edges)
    per_bucket = "; ".join(f"{v.bucket} AL {v.acceptance_length:.2f} vs break-even {v.break_even_al:.2f}: {v.speedup:.2f}x" for v in verdicts)
    lines = [f"acceptance by context at K={k}, concurrency {concurrency}: {stop_line}", f"  by context (predicted speedup): {per_bucket}", NO_CONTEXT_SETTING]
    ev: dict = {
        **base,
        "buckets": [{**asdict(v), "pays": v.pays} for v in verdicts],
        "stops_paying_at": None if first_bad is None else ([0, *edges])[bucket_labels(edges).index(verdicts[first_bad].bucket)],
        "unmatched_requests": len(unmatched),
        "lines": lines,
    }
    if first_bad is None:
        return ev
    # the closest setting: the acceptance-rate switch-off at the break-even acceptance of the first non-paying bucket
    v = verdicts[first_bad]
    threshold = round(min(1.0, max(0.0, (v.break_even_al - 1.0) / k)), 4)
    overall_cum = report.get("pairs", {}).get("bundle", {}).get("overall", {}).get("cumulative_acceptance") or [0.0] * k
    by_window = replay_switch_off(per_request, k, concurrency, threshold, _grid_costs(overall_cum, k, concurrency, costs, params))
    helps = {w: r for w, r in by_window.items() if r["ci95"][0] > 0 and r["mean_saved"] >= MIN_GAIN}
    ev["switch_off_replay"] = {"threshold": threshold, "by_window": {str(w): r for w, r in by_window.items()}, "min_gain": MIN_GAIN}
    if helps:
        w = max(helps, key=lambda x: helps[x]["mean_saved"])
        r = helps[w]
        ev.update(written=True, window=w, threshold=threshold)
        lines.append(
            f"closest setting: acceptance_rate_window_size {w}, acceptance_rate_threshold {threshold:.4f} (break-even acceptance in bucket {v.bucket}): "
            f"replayed {r['replays']}x, it saves {r['mean_saved']:.1%} of the time [{r['ci95'][0]:+.1%}, {r['ci95'][1]:+.1%}], switched off in {r['switched_off']} of {r['replays']}"
        )
    elif by_window:
        w = max(by_window, key=lambda x: by_window[x]["mean_saved"])
        r = by_window[w]
        lines.append(
            f"closest setting not written: the acceptance-rate switch-off at threshold {threshold:.4f} (break-even acceptance in bucket {v.bucket}) "
            f"does not help on this traffic: best window {w} saves {r['mean_saved']:+.1%} [{r['ci95'][0]:+.1%}, {r['ci95'][1]:+.1%}] over {r['replays']} replays "
            f"(switched off in {r['switched_off']} of {r['replays']}); it turns speculation off for every request, short ones too"
        )
    return ev


__all__ = ["NO_CONTEXT_SETTING", "BucketVerdict", "bucket_verdicts", "context_switch_off", "replay_switch_off", "stops_paying"]
