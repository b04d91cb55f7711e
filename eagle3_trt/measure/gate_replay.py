"""The acceptance gate ``recommend`` writes: a window and threshold chosen by replaying the measured
requests through TensorRT-LLM's switch-off rule.

The rule (core/speculation_control.py, read in TensorRT-LLM's py_executor.py): every iteration whose
rows drafted gives one sample, sum(accepted) / sum(drafted) over those rows; once
``acceptance_rate_window_size`` samples are recorded, a window mean below
``acceptance_rate_threshold`` switches speculation off for good, for the whole server.

The threshold is the break-even acceptance at the chosen K and concurrency (``cost_model.acceptance_gate``):
below it speculation is slower than none. The window must be long enough that traffic like the
measured traffic, whose overall acceptance is above break-even, does not trip the gate by chance.
``choose_gate`` replays it: ``REPLAYS`` times, ``concurrency`` lanes each serve requests drawn with
replacement from the measured ones (each request's own per-verification accepted counts at K, in
order; a request's first iteration is its prefill, which drafts nothing), back to back, until
``HORIZON_REQUESTS`` requests have been served; the iterations' samples are run through the rule
for every candidate window. The smallest window whose replays trip at most ``MAX_TRIP_PROBABILITY``
of the time is written, with that figure; when none does, no gate is written and the reason is said.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eagle3_trt.formats.alpha_report import AlphaReport, TrafficAlphaReport

WINDOWS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)  # candidate window sizes, in iterations
REPLAYS = 400
HORIZON_REQUESTS = 1000  # requests served per replay: the switch-off probability is stated over this many
MAX_TRIP_PROBABILITY = 0.01
MIN_SEQUENCES = 2  # requests with at least one verification needed to replay anything


@dataclass(frozen=True)
class GateChoice:
    window: int | None  # None: no window keeps the switch-off probability small enough; no gate
    threshold: float
    trip_probability: float | None  # at the written window (replays that tripped / REPLAYS)
    evidence: dict

    def line(self) -> str:
        ev = self.evidence
        if ev.get("applies") is False:  # measure/method_gate.py: no acceptance-rate switch-off for this method
            return f"acceptance gate: none for {ev['method']}: {ev['reason']}"
        of = f" of {ev['method']}" if ev.get("method") else ""  # a winning alpha --modes mode (measure/method_gate.py)
        where = f"{ev['requests']} measured requests{of} at K={ev['k']}, concurrency {ev['concurrency']}"
        if self.window is None:
            return f"acceptance gate: not written: {ev['reason']} ({where})"
        return (
            f"acceptance gate: window {self.window} iterations, threshold {self.threshold:.4f} (break-even acceptance{of} at K={ev['k']}); "
            f"replayed {ev['replays']}x over {ev['horizon_requests']} requests drawn from the {where} "
            f"(overall acceptance {ev['overall_alpha']:.3f}): switched off in {ev['trips_at_window']} of {ev['replays']} "
            f"(probability {self.trip_probability:.3f}, at most {MAX_TRIP_PROBABILITY:g} allowed)"
        )


def sequences_at(report: AlphaReport | TrafficAlphaReport, k: int) -> list[list[int]] | None:
    """Each measured request's accepted draft tokens per verification at K, None when the report
    does not hold them (measured before they were recorded, or not at K). An alpha report: its
    requests at the run's own K or its --sweep; an ``alpha --traffic`` report: the captured greedy
    requests, at every K it replayed."""
    out = []
    if isinstance(report, TrafficAlphaReport):
        for t in report.requests:
            seq = t.accepted_seq_by_k.get(k)
            if seq is None:
                return None
            out.append(list(seq))
        return out or None
    run_k = report.settings.max_draft_len
    for r in report.pairs.bundle.requests:
        seq = r.accepted_seq_by_k.get(k)
        if seq is None and run_k == k and "accepted_seq" in r.model_fields_set:  # absent in reports from before the sequences
            seq = r.accepted_seq
        if seq is None:
            return None
        out.append(list(seq))
    return out or None


def replay_lanes(flats: np.ndarray, starts: np.ndarray, lengths: np.ndarray, concurrency: int, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """``concurrency`` lanes, each serving requests drawn with replacement back to back, over the
    iterations every lane is still busy: ``flats`` [m, N] holds m per-iteration series of every
    request back to back (request i at ``starts[i]:starts[i] + lengths[i]``); returns [m, concurrency, n].
    ``replay_rates`` replays the accepted counts; measure/switch_off.py also the contexts and tokens."""
    per_lane = max(1, -(-horizon // concurrency))
    picks = rng.integers(0, len(starts), size=(concurrency, per_lane))
    n = int(lengths[picks].sum(1).min())  # iterations every lane is still busy
    lanes = np.empty((flats.shape[0], concurrency, n))
    for i in range(concurrency):
        ln = lengths[picks[i]]
        # gather index of each iteration: its request's start + its offset within the request
        first = np.repeat(starts[picks[i]] - np.concatenate([[0], np.cumsum(ln)[:-1]]), ln)
        lanes[:, i] = flats[:, (first + np.arange(ln.sum()))[:n]]
    return lanes


def replay_rates(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, k: int, concurrency: int, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """One replay's per-iteration samples. ``flat`` holds every request's iterations back to back
    (-1 for its prefill, which drafts nothing, then its accepted counts per verification), request
    i at ``starts[i]:starts[i] + lengths[i]``; iterations where no row drafted are dropped, as
    TensorRT-LLM records nothing for them."""
    lanes = replay_lanes(flat[None], starts, lengths, concurrency, horizon, rng)[0]
    a = np.clip(lanes, 0, None).sum(0)
    d = (lanes >= 0).sum(0) * k
    keep = d > 0
    return a[keep] / d[keep]


def trips(rates: np.ndarray, window: int, threshold: float) -> bool:
    """Whether TensorRT-LLM's gate (window, threshold) switches off on this sample series: some
    window of ``window`` consecutive samples has a mean below ``threshold`` (the gate checks every
    sample from the window-th on, over the last ``window``; fewer samples never trip it)."""
    return first_trip(rates, window, threshold) is not None


def first_trip(rates: np.ndarray, window: int, threshold: float) -> int | None:
    """Index of the sample that switches the gate off (the last of the first window whose mean is
    below ``threshold``), None when none does (``trips``)."""
    if len(rates) < window:
        return None
    c = np.concatenate([[0.0], np.cumsum(rates)])
    # sums compared with threshold * window: no division, so a mean equal to the threshold stays "not below"
    below = np.flatnonzero((c[window:] - c[:-window]) < threshold * window - 1e-9)
    return int(below[0]) + window - 1 if len(below) else None


def choose_gate(seqs: list[list[int]], k: int, threshold: float, concurrency: int, *, seed: int = 0) -> GateChoice:
    """The smallest window of ``WINDOWS`` whose replays switch speculation off in at most
    ``MAX_TRIP_PROBABILITY`` of them (module docstring)."""
    seqs = [s for s in seqs if s]
    drafted = sum(len(s) for s in seqs) * k
    overall = sum(sum(s) for s in seqs) / drafted if drafted else 0.0
    base = {
        "rule": "TensorRT-LLM py_executor._update_batch_acceptance_rate + SpeculationGate.record_acceptance_rate: one sample per iteration, window in iterations, off for good",
        "k": k,
        "concurrency": concurrency,
        "requests": len(seqs),
        "overall_alpha": round(overall, 4),
        "threshold": threshold,
        "replays": REPLAYS,
        "horizon_requests": HORIZON_REQUESTS,
        "max_trip_probability": MAX_TRIP_PROBABILITY,
        "resampled": "measured requests (distinct prompts), with replacement",
    }
    if len(seqs) < MIN_SEQUENCES:
        return GateChoice(None, threshold, None, {**base, "reason": f"only {len(seqs)} measured requests verified drafts at K={k}"})
    if overall < threshold:
        reason = f"overall acceptance {overall:.3f} at K={k} is below break-even {threshold:.4f}: the gate would switch speculation off at once"
        return GateChoice(None, threshold, None, {**base, "reason": reason})
    rng = np.random.default_rng(seed)
    lengths = np.array([1 + len(s) for s in seqs])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat = np.array([x for s in seqs for x in (-1, *s)], dtype=np.float64)
    series = [replay_rates(flat, starts, lengths, k, concurrency, HORIZON_REQUESTS, rng) for _ in range(REPLAYS)]
    by_window = {w: sum(trips(r, w, threshold) for r in series) for w in WINDOWS}
    base["trips_by_window"] = {str(w): n for w, n in by_window.items()}
    for w in WINDOWS:
        if by_window[w] / REPLAYS <= MAX_TRIP_PROBABILITY:
            return GateChoice(w, threshold, by_window[w] / REPLAYS, {**base, "window": w, "trips_at_window": by_window[w]})
    reason = (
        f"even a {WINDOWS[-1]}-iteration window switches off in {by_window[WINDOWS[-1]]} of {REPLAYS} replays "
        f"(overall acceptance {overall:.3f} is too close to break-even {threshold:.4f})"
    )
    return GateChoice(None, threshold, None, {**base, "reason": reason})
