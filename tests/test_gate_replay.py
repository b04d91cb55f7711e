"""The acceptance gate recommend writes (measure/gate_replay.py): replayed through TensorRT-LLM's rule."""

from __future__ import annotations

import random

import numpy as np
import pytest

from eagle3_trt.core.speculation_control import SpeculationControl, SpeculationGate
from eagle3_trt.measure.gate_replay import MAX_TRIP_PROBABILITY, choose_gate, sequences_at, trips


def _traffic(n: int, lo: float, hi: float, k: int, seed: int) -> list[list[int]]:
    """Requests whose drafts are accepted with a per-request probability in [lo, hi] (chain: stop at the first reject)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = rng.uniform(lo, hi)
        seq = []
        for _ in range(rng.randint(4, 40)):
            a = 0
            while a < k and rng.random() < p:
                a += 1
            seq.append(a)
        out.append(seq)
    return out


def test_trip_check_is_the_gates_own_rule():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rates = rng.choice([0.0, 1 / 3, 2 / 3, 1.0], size=int(rng.integers(1, 30)))
        w, t = int(rng.integers(1, 8)), float(rng.choice([0.2, 1 / 3, 0.5]))
        g = SpeculationGate(w, t)
        assert trips(rates, w, t) == any(g.record(float(r)) for r in rates)


def test_a_window_of_four_requests_trips_traffic_above_break_even_and_the_written_one_does_not():
    """The issue's case: overall acceptance well above the 0.33 break-even, requests that vary a lot.
    A 4-iteration window switches speculation off in almost every replay; the written window keeps
    it at most 1%, and runs of TensorRT-LLM's rule on fresh replays (another seed) agree."""
    k, thr = 5, 0.33
    seqs = _traffic(197, 0.35, 0.95, k, seed=3)
    g = choose_gate(seqs, k, thr, concurrency=4)
    ev = g.evidence
    assert ev["overall_alpha"] > thr and g.window is not None and g.window > 4
    assert ev["trips_by_window"]["16"] / ev["replays"] > 0.5
    assert g.trip_probability is not None and g.trip_probability <= MAX_TRIP_PROBABILITY
    assert f"window {g.window} iterations" in g.line() and "197 measured requests at K=5, concurrency 4" in g.line()
    # independent check: serve 300 requests at concurrency 4 through SpeculationControl (the runtime's rule)
    rng = random.Random(99)
    tripped = 0
    for _ in range(100):
        c = SpeculationControl(max_draft_len=k, gate=SpeculationGate(g.window, g.threshold))
        lanes = [[] for _ in range(4)]
        served = 0
        while served < 300 and c.off_from is None:
            for lane in lanes:
                if not lane:
                    lane += [None, *seqs[rng.randrange(len(seqs))]]  # None: the prefill iteration
                    served += 1
            c.k_for(4)
            steps = [lane.pop(0) for lane in lanes]
            c.after([0 if a is None else k for a in steps], [0 if a is None else a for a in steps])
        tripped += c.off_from is not None
    assert tripped <= 3


def test_no_gate_when_acceptance_is_at_or_below_break_even_or_too_close():
    k = 3
    low = choose_gate(_traffic(50, 0.05, 0.2, k, seed=1), k, 0.33, concurrency=1)
    assert low.window is None and "below break-even" in low.line()
    # acceptance barely above break-even: no window keeps the switch-off rare, so none is written
    seqs = _traffic(60, 0.30, 0.45, k, seed=2)
    overall = sum(map(sum, seqs)) / (k * sum(map(len, seqs)))
    near = choose_gate(seqs, k, overall - 0.01, concurrency=1)
    assert near.window is None and "too close to break-even" in near.line()


def test_sequences_come_from_the_report_at_any_measured_k():
    from eagle3_trt.testing.alpha_reports import alpha_report, traffic_report

    report = alpha_report(
        settings={"max_draft_len": 3},
        requests=[{"accepted_seq": [1, 2], "accepted_seq_by_k": {"5": [4, 0]}}, {"accepted_seq": [0], "accepted_seq_by_k": {"5": [5]}}],
    )
    assert sequences_at(report, 3) == [[1, 2], [0]]
    assert sequences_at(report, 5) == [[4, 0], [5]]
    assert sequences_at(report, 4) is None
    assert sequences_at(alpha_report(requests=[{"alpha": 0.5}]), 3) is None  # a report from before the sequences
    traffic = traffic_report(requests=[{"request_id": "a", "accepted_seq_by_k": {"2": [2, 0, 1]}}])
    assert sequences_at(traffic, 2) == [[2, 0, 1]] and sequences_at(traffic, 3) is None


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_window_refused(bad):
    with pytest.raises(ValueError, match="acceptance_rate_window_size"):
        SpeculationGate(bad, 0.3)


def test_gate_traffic_must_be_an_alpha_traffic_report_of_this_bundle(fp8_bundle, tmp_path, capsys):
    import json

    from eagle3_trt.cli import main

    f = tmp_path / "report.json"
    for content, what in (("{not json", "not valid JSON"), (json.dumps({"kind": "eagle3-trt alpha report"}), "is not an alpha --traffic report")):
        f.write_text(content)
        assert main(["recommend", str(fp8_bundle), "--report", str(f), "--gate-traffic", str(f)]) == 2
        err = capsys.readouterr().err.strip()
        assert what in err and len(err.splitlines()) == 1
