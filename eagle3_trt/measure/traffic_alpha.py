"""``eagle3-trt alpha BUNDLE --traffic DIR``: measured alpha against served alpha on captured traffic.

The records BUNDLE served (``bundle_fingerprint`` == its manifest fingerprint; others are counted
and skipped) are measured offline on the reference runtime (measure/traffic_measure.py): per-K
alpha and acceptance length (AL), then the offline AL against the AL the server reported for
the same requests, with a paired bootstrap interval of the difference (core/paired_ci.py).

Tolerance. A greedy request served by the same engine gives identical counts (the server's
figures come from the engine the reference runtime is: runtime/llm_api.SpecStats), so the
difference and its interval are exactly 0 and every greedy request is reported identical. A
sampled request differs run to run; the bootstrap interval carries that noise. ``AL_TOLERANCE``
(0.02 tokens per forward, under 1% of a typical AL of 2-4) is the stated allowance for a serving
stack whose kernels differ from this CPU reference (TensorRT-LLM on a GPU flips a rare near-tie
argmax); it is an allowance, not a figure measured on a GPU. The difference is flagged "beyond
sampling noise" when the whole 95% interval lies more than ``AL_TOLERANCE`` from 0.

Drift: the server's own AL per window of consecutive requests (oldest first, every bundle in the
traffic, each window naming the bundles it holds) and per category where records carry one.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle3_trt.core.paired_ci import paired_ratio_diff
from eagle3_trt.core.stats import aggregate
from eagle3_trt.errors import UserError
from eagle3_trt.formats.alpha_report import OfflineVsServed, TrafficAlphaReport
from eagle3_trt.formats.traffic import ServedAcceptance, TrafficRecord, iter_traffic
from eagle3_trt.measure.acceptance import incomplete
from eagle3_trt.measure.traffic_measure import TrafficItem, measure_items, prepare, prompt_groups
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.runtime.loader import default_device, engine_from_bundle

AL_TOLERANCE = 0.02  # tokens per target forward (module docstring)
DRIFT_WINDOWS = 10  # default: the traffic in about this many windows
MIN_DRIFT_WINDOW = 10  # requests


@dataclass(frozen=True)
class ServedRequest:
    """What the drift summary keeps of a record it does not measure: four fields, not its texts and ids."""

    time_unix: float
    bundle_fingerprint: str
    acceptance: ServedAcceptance
    category: str | None


def served_figures(records: Sequence[TrafficRecord | ServedRequest]) -> dict:
    """The server's own acceptance over ``records``: pooled AL and alpha, with the counts."""
    tok = sum(r.acceptance.completion_tokens for r in records)
    fw = sum(r.acceptance.target_forwards for r in records)
    dr = sum(r.acceptance.draft_tokens for r in records)
    acc = sum(r.acceptance.accepted_draft_tokens for r in records)
    return {
        "requests": len(records),
        "acceptance_length": tok / fw if fw else 0.0,
        "alpha": acc / dr if dr else 0.0,
        "completion_tokens": tok,
        "target_forwards": fw,
    }


def drift_summary(records: Sequence[TrafficRecord | ServedRequest], window: int | None = None) -> dict:
    """Served AL per window of ``window`` consecutive finished requests, and per category."""
    done = [r for r in records if r.acceptance.target_forwards > 0]
    if window is not None and window < 1:
        raise UserError("--window", f"{window}", "a drift window holds at least 1 request")
    w = window or max(MIN_DRIFT_WINDOW, math.ceil(len(done) / DRIFT_WINDOWS))
    windows = []
    for s in range(0, len(done), w):
        chunk = done[s : s + w]
        windows.append(
            {
                "start_unix": chunk[0].time_unix,
                "end_unix": chunk[-1].time_unix,
                **served_figures(chunk),
                "bundles": sorted({r.bundle_fingerprint[:12] for r in chunk}),
            }
        )
    cats: dict[str, list[TrafficRecord | ServedRequest]] = {}
    for r in done:
        if r.category:
            cats.setdefault(r.category, []).append(r)
    return {"window": w, "windows": windows, "by_category": {c: served_figures(v) for c, v in sorted(cats.items())}}


def run_alpha_traffic(
    bundle: Path,
    traffic_dir: Path,
    *,
    device: str | None = None,
    batch_size: int = 16,
    sweep: tuple[int, ...] = (),
    tolerance: float = AL_TOLERANCE,
    window: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> TrafficAlphaReport:
    """Measure BUNDLE on the traffic it served and compare with the server's figures; the report (formats/alpha_report.py)."""
    say = progress or (lambda m: None)
    if tolerance < 0:
        raise UserError("--tolerance", f"{tolerance} is negative", "a tolerance in tokens per forward, e.g. 0.02")
    b = open_bundle(Path(bundle))
    fp = b.manifest.fingerprint
    # The capture is read one segment at a time; what is kept is the records of this bundle (they
    # are measured) and four fields of every request for the drift summary.
    records: list[ServedRequest] = []
    mine: list[TrafficRecord] = []
    others: dict[str, int] = {}
    for r in iter_traffic(Path(traffic_dir)):
        records.append(ServedRequest(r.time_unix, r.bundle_fingerprint, r.acceptance, r.category))
        if r.bundle_fingerprint == fp:
            mine.append(r)
        else:
            others[r.bundle_fingerprint[:12]] = others.get(r.bundle_fingerprint[:12], 0) + 1
    records.sort(key=lambda r: r.time_unix)  # oldest first, as read_traffic orders them
    mine.sort(key=lambda r: r.time_unix)
    drift = drift_summary(records, window)  # a bad --window fails before any model is loaded
    if not mine:
        seen = ", ".join(f"{f} ({n})" for f, n in sorted(others.items()))
        raise UserError(
            traffic_dir,
            f"holds no request served by {b.path} (fingerprint {fp[:12]}); it holds {seen}",
            "pass the bundle that served this traffic (its manifest fingerprint is in every record)",
        )
    say(f"loading {b.path} ({b.label})")
    eng = engine_from_bundle(b, device=default_device(device))
    too_long: list[str] = []
    items, skipped = prepare(mine, eng, source=str(traffic_dir), too_long=too_long)
    if not items:
        if too_long:  # measurable requests, none of which fits the bundle: said as the prompt-file measurements say it
            short = incomplete(len(too_long), 0, too_long, str(traffic_dir))
            assert short is not None
            raise short
        raise UserError(traffic_dir, f"none of the {len(mine)} requests {b.path} served can be measured ({skipped[0]})", "capture finished requests")
    ks = tuple(sorted(set(sweep) | set(range(1, b.k + 1))))
    t0 = time.perf_counter()
    measure_items(eng, items, k=b.k, sweep=ks, batch_size=batch_size, say=say)
    report: dict = {
        "schema": 1,
        "kind": "eagle3-trt alpha --traffic report",
        "bundle": str(b.path),
        "bundle_fingerprint": fp,
        "traffic": str(traffic_dir),
        "max_draft_len": b.k,
        "records": len(records),
        "compared": len(items),
        "prompts": {"chat": sum(it.record.chat for it in items), "raw": sum(not it.record.chat for it in items)},
        "skipped": {"other_bundles": others, "unmeasurable": skipped, "beyond_max_seq_len": too_long},
        "per_k": _per_k(items, ks),
        "offline": _offline(items),
        "served": served_figures([it.record for it in items]),
        "comparison": _comparison(items, tolerance),
        "drift": drift,
        # each greedy request's accepted drafts per verification at every K, in order: what
        # `recommend --gate-traffic` replays through TensorRT-LLM's switch-off (measure/gate_replay.py)
        "requests": [
            {"request_id": it.record.request_id, "accepted_seq_by_k": {str(k): st.accepted_seq for k, st in sorted(it.stats_by_k.items())}}
            for it in items
            if it.greedy and it.stats_by_k
        ],
        "seconds": time.perf_counter() - t0,
    }
    return TrafficAlphaReport.model_validate(report)


def _per_k(items: Sequence[TrafficItem], ks: Sequence[int]) -> dict:
    """Per K: offline alpha and AL over the greedy requests (the estimator replays every K)."""
    greedy = [it for it in items if it.greedy]
    out = {}
    for k in ks:
        a = aggregate(it.stats_by_k[k] for it in greedy if k in it.stats_by_k)
        if a.requests:
            out[str(k)] = {"alpha": a.alpha, "acceptance_length": a.acceptance_length, "requests": a.requests}
    return out


def _offline(items: Sequence[TrafficItem]) -> dict:
    a = aggregate(it.stats for it in items if it.stats is not None)
    return {
        "requests": a.requests,
        "alpha": a.alpha,
        "acceptance_length": a.acceptance_length,
        "generated_tokens": a.generated_tokens,
        "target_forwards": a.target_forwards,
    }


def _comparison(items: Sequence[TrafficItem], tolerance: float) -> dict:
    measured = [it for it in items if it.stats is not None]
    group_of = prompt_groups([it.record for it in measured])
    d = paired_ratio_diff(
        [it.stats.generated_tokens for it in measured],  # type: ignore[union-attr]
        [it.stats.target_forwards for it in measured],  # type: ignore[union-attr]
        [it.served_tokens for it in measured],
        [it.served_forwards for it in measured],
        groups=[group_of[id(it.record)] for it in measured],  # a prompt's requests resampled together
    )
    greedy = [it for it in measured if it.greedy]
    differ = [it.record.request_id for it in greedy if not it.identical()]
    return {
        "offline_acceptance_length": d.a,
        "served_acceptance_length": d.b,
        "diff": d.diff,
        "ci": [d.lo, d.hi],
        "level": d.level,
        "n": d.n,
        "prompts": d.n_groups,
        "tolerance": tolerance,
        "beyond_sampling_noise": d.excludes_zero_by(tolerance),
        "greedy": {"requests": len(greedy), "identical": len(greedy) - len(differ), "differ": differ[:20]},
        "sampled": len(measured) - len(greedy),
    }


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def comparison_line(c: OfflineVsServed) -> str:
    """The one line of the live check (what the tests read)."""
    flag = f"BEYOND SAMPLING NOISE (tolerance {c.tolerance:g})" if c.beyond_sampling_noise else f"within sampling noise (tolerance {c.tolerance:g})"
    return (
        f"offline vs served: AL {c.offline_acceptance_length:.4f} vs {c.served_acceptance_length:.4f}, "
        f"diff {c.diff:+.4f}, {round(c.level * 100)}% CI [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}] ({c.n} requests from {c.prompts} distinct prompts): {flag}"
    )


def summary_lines(rep: TrafficAlphaReport) -> list[str]:
    sk = rep.skipped
    other = sum(sk.other_bundles.values())
    lines = [
        f"traffic {rep.traffic}: {rep.records} records; {rep.compared} served by this bundle (fingerprint {rep.bundle_fingerprint[:12]}) measured"
        + (f"; skipped: {other} served by other bundles ({', '.join(f'{f} {n}' for f, n in sk.other_bundles.items())})" if other else "")
        + (f"; {len(sk.unmeasurable)} not measurable (first: {sk.unmeasurable[0]})" if sk.unmeasurable else ""),
    ]
    g = rep.comparison.greedy
    if rep.per_k:
        per_k = "; ".join(f"K={k} alpha {v.alpha:.3f} AL {v.acceptance_length:.3f}" for k, v in rep.per_k.items())
        lines.append(f"offline per K ({g.requests} greedy requests, {rep.prompts.chat} chat / {rep.prompts.raw} raw as served): {per_k}")
    o = rep.offline
    lines.append(
        f"offline at K={rep.max_draft_len} (all {o.requests} requests): alpha {o.alpha:.3f}, AL {o.acceptance_length:.3f}; served alpha {rep.served.alpha:.3f}"
    )
    lines.append(comparison_line(rep.comparison))
    if g.requests:
        lines.append(
            f"greedy requests: {g.identical} of {g.requests} identical to the server's (tokens, target forwards, output)"
            + (f"; differ: {', '.join(g.differ)}" if g.differ else "")
        )
    d = rep.drift
    lines.append(f"drift: served AL per {d.window} requests (all bundles in the traffic):")
    lines += [
        f"  {_when(w.start_unix)} .. {_when(w.end_unix)}  AL {w.acceptance_length:.3f}  alpha {w.alpha:.3f}  ({w.requests} requests; {', '.join(w.bundles)})"
        for w in d.windows
    ]
    if d.by_category:
        lines.append("served AL by category: " + ", ".join(f"{c} {v.acceptance_length:.3f} ({v.requests})" for c, v in d.by_category.items()))
    return lines
