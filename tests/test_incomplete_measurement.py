"""A measurement that measured nothing, or fewer requests than the prompts file asked for, does not pass.

``alpha``, ``gate`` and ``alpha --against`` on the tiny FP8 bundle with prompts longer than its
max_seq_len: when every prompt is too long the command exits 2 with one line and writes no report (it
used to print AL 0.00, write a report and exit 0); when some are, ``alpha`` writes the report, which
records how many turns were asked, how many were skipped and why, and then exits 2 with one line.
The error is recognised by its type (errors.IncompleteMeasurement).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_trt.cli import main
from eagle3_trt.errors import IncompleteMeasurement
from eagle3_trt.formats.alpha_report import read_alpha_report
from eagle3_trt.measure.gate import run_gate
from eagle3_trt.pipeline.bundle import open_bundle


def _prompts(path: Path, bundle: Path, short: int, long: int) -> Path:
    """``short`` prompts that fit and ``long`` ones past the bundle's max_seq_len (one token a word at least)."""
    n = open_bundle(bundle).options.max_seq_len + 8
    texts = ["List three fruits.", "Explain binary search."][:short] + [" ".join(["word"] * n)] * long
    path.write_text("".join(json.dumps({"id": f"p{i}", "turns": [t]}) + "\n" for i, t in enumerate(texts)))
    return path


def _run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_alpha_that_measured_nothing_exits_2_and_writes_no_report(fp8_bundle, tmp_path, capsys):
    prompts = _prompts(tmp_path / "p.jsonl", fp8_bundle, 0, 2)
    out = tmp_path / "rep"
    rc, err = _run(["alpha", str(fp8_bundle), "--prompts", str(prompts), "--max-tokens", "8", "-o", str(out)], capsys)
    line = _one_line(err)
    assert rc == 2 and "measured no request: all 2 asked were skipped" in line and "prompt tokens >= max_seq_len" in line
    assert not (out / "report.json").exists()


def test_alpha_that_measured_fewer_than_asked_writes_the_report_and_exits_2(fp8_bundle, tmp_path, capsys):
    prompts = _prompts(tmp_path / "p.jsonl", fp8_bundle, 2, 1)
    out = tmp_path / "rep"
    rc, err = _run(["alpha", str(fp8_bundle), "--prompts", str(prompts), "--max-tokens", "8", "-o", str(out)], capsys)
    assert rc == 2 and "measured 2 of the 3 requests asked: 1 skipped (first: p2 turn 1:" in _one_line(err)
    p = read_alpha_report(out / "report.json").pairs.bundle  # the schema reads it back
    assert (p.requests_asked, p.requests_skipped, len(p.requests)) == (3, 1, 2) and p.skipped[0].startswith("p2 turn 1:")
    assert p.overall.target_forwards > 0 and p.overall.requests == 2  # the two that fit were measured
    # --limit 2 asks for the two that fit: complete, exit 0
    rc, err = _run(["alpha", str(fp8_bundle), "--prompts", str(prompts), "--max-tokens", "8", "--limit", "2", "-o", str(tmp_path / "r2")], capsys)
    assert rc == 0, err


def test_gate_that_measured_fewer_than_asked_gives_no_verdict(fp8_bundle, tmp_path, capsys):
    prompts = _prompts(tmp_path / "p.jsonl", fp8_bundle, 1, 1)
    with pytest.raises(IncompleteMeasurement):
        run_gate(fp8_bundle, prompts, max_tokens=8)
    rc, err = _run(["gate", str(fp8_bundle), "--prompts", str(prompts), "--max-tokens", "8", "--threshold", "0"], capsys)
    assert rc == 2 and "measured 1 of the 2 requests asked" in _one_line(err)


def test_alpha_against_that_measured_nothing_exits_2(fp8_bundle, k5_bundle, tmp_path, capsys):
    prompts = _prompts(tmp_path / "p.jsonl", fp8_bundle, 0, 1)
    out = tmp_path / "vs"
    rc, err = _run(["alpha", str(fp8_bundle), "--against", str(k5_bundle), "--prompts", str(prompts), "--max-tokens", "8", "-o", str(out)], capsys)
    assert rc == 2 and "measured no request" in _one_line(err)
    assert not (out / "report.json").exists()


def test_alpha_traffic_with_a_request_beyond_max_seq_len_records_it_and_exits_2(fp8_bundle, tmp_path, capsys):
    """Captured traffic whose prompt the bundle cannot hold (served by a bundle of a longer max_seq_len, here
    a served record given a longer prompt): measured on the rest, recorded in skipped.beyond_max_seq_len."""
    from eagle3_trt.formats.alpha_report import read_traffic_report
    from eagle3_trt.testing.served_traffic import served_records, write_traffic

    recs = served_records(fp8_bundle, [[0, 17, 42, 99, 7], [0, 5, 6, 7, 8, 9], [0, 11, 12, 13]], max_tokens=8)
    n = open_bundle(fp8_bundle).options.max_seq_len
    long = recs[2].model_copy(update={"prompt_ids": [7] * (n + 4), "request_id": "long"})
    cap = write_traffic(tmp_path / "cap", [recs[0], recs[1], long])
    out = tmp_path / "rep"
    rc, err = _run(["alpha", str(fp8_bundle), "--traffic", str(cap), "-o", str(out)], capsys)
    assert rc == 2 and "measured 2 of the 3 requests asked: 1 skipped (first: long:" in _one_line(err)
    rep = read_traffic_report(out / "report.json")
    assert rep.compared == 2 and len(rep.skipped.beyond_max_seq_len) == 1 and rep.skipped.beyond_max_seq_len[0].startswith("long:")
