"""The benchmark's gate: is alpha high enough, and up to which concurrency is P99 ITL no worse with speculation?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_trt.clients.bench_stats import ArmResult
from eagle3_trt.measure.gate_verdict import DEFAULT_GATE_THRESHOLD, alpha_shortfall

DEFAULT_ALPHA_THRESHOLD = DEFAULT_GATE_THRESHOLD  # one bar for `gate`, `bench` and the build's check


@dataclass
class Gate:
    alpha: float | None
    alpha_source: str
    alpha_threshold: float
    alpha_ok: bool
    itl_tolerance: float
    per_concurrency: list[dict]
    switch_off_above: int | None
    verdict: str  # pass | pass_with_switch_off | fail
    recommendation: str


def evaluate_gate(arms: list[ArmResult], alpha_threshold: float = DEFAULT_ALPHA_THRESHOLD, itl_tolerance: float = 0.0) -> Gate:
    """alpha >= threshold, and per concurrency P99 ITL(on) <= P99 ITL(off) * (1 + tolerance)."""
    alpha, source = _pooled_alpha(arms)
    alpha_ok = alpha_shortfall(alpha, alpha_threshold) is None
    rows = _itl_rows(arms, itl_tolerance)
    judged = [r for r in rows if r["itl_ok"] is not None]
    switch: int | None = None
    for r in judged:
        if not r["itl_ok"]:
            break
        switch = r["concurrency"]
    # Requests served with speculation on that drafted nothing at all: TensorRT-LLM's acceptance gate
    # (acceptance_rate_threshold) switches speculation off for the whole server for good once it trips,
    # and the requests still say speculative_decoding=true.
    drafted_nothing = alpha is None and any(a.speculative and a.requests > a.errors and not a.speculation_switched_off for a in arms)
    verdict, rec = _verdict(alpha, alpha_threshold, alpha_ok, rows, switch, drafted_nothing)
    return Gate(alpha, source, alpha_threshold, alpha_ok, itl_tolerance, rows, switch, verdict, rec)


def _pooled_alpha(arms: list[ArmResult]) -> tuple[float | None, str]:
    """(alpha, its source): pooled over every speculative run, from the server's counters when present."""
    on = [a for a in arms if a.speculative]
    draft_m = [a for a in on if a.alpha_metrics is not None]
    if draft_m:
        return sum(a.alpha_metrics for a in draft_m) / len(draft_m), "metrics endpoint"  # type: ignore[misc]
    vals = [a.alpha_responses for a in on if a.alpha_responses is not None]
    return (sum(vals) / len(vals) if vals else None), "responses"


def _itl_rows(arms: list[ArmResult], itl_tolerance: float) -> list[dict[str, Any]]:
    """One row per concurrency level: P99 ITL on vs off and whether speculation kept it within tolerance."""
    by_c: dict[int, dict[bool, ArmResult]] = {}
    for a in arms:
        by_c.setdefault(a.concurrency, {})[a.speculative] = a
    rows: list[dict[str, Any]] = []
    for c in sorted(by_c):
        a_on, a_off = by_c[c].get(True), by_c[c].get(False)
        p_on = a_on.itl_p99_s if a_on else None
        p_off = a_off.itl_p99_s if a_off else None
        switched_off = bool(a_on and a_on.speculation_switched_off)
        ok = p_on is not None and p_off is not None and p_on <= p_off * (1 + itl_tolerance)
        thin = (a_on.thin_p99() if a_on else []) + (a_off.thin_p99() if a_off else [])
        rows.append(
            {
                "concurrency": c,
                "itl_p99_on_s": p_on,
                "itl_p99_off_s": p_off,
                "ratio": (p_on / p_off) if (p_on and p_off) else None,
                # None: the server ran the "on" arm without speculation, so there is nothing to judge
                "itl_ok": None if switched_off else ok,
                "itl_samples_on": a_on.itl_samples if a_on else 0,
                "itl_samples_off": a_off.itl_samples if a_off else 0,
                "thin_p99": [x for x in thin if x.startswith("ITL")],
            }
        )
    return rows


def _verdict(
    alpha: float | None, alpha_threshold: float, alpha_ok: bool, rows: list[dict[str, Any]], switch: int | None, drafted_nothing: bool = False
) -> tuple[str, str]:
    """(verdict, recommendation) from alpha and the judged rows (``switch``: the last level before ITL got worse)."""
    judged = [r for r in rows if r["itl_ok"] is not None]
    not_judged = [r["concurrency"] for r in rows if r["itl_ok"] is None]
    all_ok = bool(judged) and all(r["itl_ok"] for r in judged)
    top = judged[-1]["concurrency"] if judged else None
    off_note = (
        (f"; at concurrency {', '.join(map(str, not_judged))} the server already ran without speculation (max_concurrency), which is not part of this verdict")
        if not_judged
        else ""
    )
    if alpha_ok and all_ok:
        return "pass", f"keep speculation on at every concurrency where it ran (up to {top}){off_note}"
    if alpha_ok and switch is not None:
        failed = [r["concurrency"] for r in judged if not r["itl_ok"]]
        return "pass_with_switch_off", (
            f"speculation on up to concurrency {switch} only; it is slower at {', '.join(map(str, failed))}: "
            f"switch it off above {switch} (speculative_config.max_concurrency: {switch}){off_note}"
        )
    why = []
    if (short := alpha_shortfall(alpha, alpha_threshold)) is not None:
        if drafted_nothing:
            short += (
                ": the server drafted no tokens for requests it served with speculation on (its acceptance gate,"
                " acceptance_rate_threshold, may have switched speculation off for good: restart it)"
            )
        why.append(short)
    if switch is None and judged:
        why.append(f"P99 ITL with speculation is worse already at concurrency {judged[0]['concurrency']}")
    if not judged:
        why.append("no concurrency level ran with speculation")
    return "fail", "do not enable speculation (" + "; ".join(why) + ")"
