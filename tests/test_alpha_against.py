"""`eagle3-trt alpha BUNDLE --against OTHER` (measure/against.py) on two real bundles of the shipped
tiny target: an FP8 one at K=3 and a BF16 one at K=4, measured on the same two-category prompts.

It prints both bundles' columns per category with the paired 95% intervals, the method and K per
concurrency and which to deploy; writes the comparison into the alpha report; and refuses, in one
line and before loading any model, a bundle built from another target.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eagle3_trt.cli import main
from eagle3_trt.formats.alpha_report import read_alpha_report
from eagle3_trt.measure.bundle_costs import bundle_cost_inputs
from eagle3_trt.measure.cost_model import model_costs, predict_from_tokens
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.pipeline.presets import load_preset
from eagle3_trt.testing.served_traffic import served_records, write_traffic
from eagle3_trt.testing.tiny_pair import make_pair

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[Path, Path]:
    """The shipped tiny pair (trained: acceptance far from 0) built twice: FP8 K=3 and BF16 K=4."""
    d = tmp_path_factory.mktemp("against")
    fp8 = build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", calib_samples=4, out=str(d / "tiny-fp8"))).bundle
    bf16 = build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", quant="bf16", max_draft_len=4, out=str(d / "tiny-bf16-k4"))).bundle
    return fp8, bf16


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    """Two categories: the code completions (python) and the edit/repeat chat prompts, two of each."""
    lines = (ROOT / "examples/code.jsonl").read_text().splitlines()[:2] + (ROOT / "examples/code_edit.jsonl").read_text().splitlines()[:2]
    f = tmp_path_factory.mktemp("p") / "p.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


def test_against_prints_both_columns_intervals_and_a_verdict(bundles, prompts, tmp_path, capsys):
    fp8, bf16 = bundles
    out = tmp_path / "rep"
    rc = main(["alpha", str(fp8), "--against", str(bf16), "--prompts", str(prompts), "--max-tokens", "16", "--concurrency", "4", "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "A = tiny-fp8 (chain, K=3), B = tiny-bf16-k4 (chain, K=4)" in text
    rep = json.loads((out / "report.json").read_text())
    sec = rep["against"]
    cats = [r["category"] for r in sec["rows"]]
    assert cats[0] == "overall" and sorted(cats[1:]) == ["python", "repeat"]
    for r in sec["rows"]:
        # each row printed with both columns and the three paired intervals, as the report holds them
        al, alpha, sp = r["acceptance_length"], r["alpha"], r["predicted_speedup"]
        line = next(x for x in text.splitlines() if x.startswith(r["category"]))
        assert f"{al['a']:.2f} {al['b']:>5.2f}" in line and f"[{al['ci'][0]:+.2f}, {al['ci'][1]:+.2f}]" in line
        assert f"[{alpha['ci'][0]:+.3f}, {alpha['ci'][1]:+.3f}]" in line and f"[{sp['ci'][0]:+.2f}, {sp['ci'][1]:+.2f}]" in line
        assert al["ci"][0] <= al["diff"] <= al["ci"][1] and sp["ci"][0] <= sp["diff"] <= sp["ci"][1]
        assert 1.0 <= al["a"] <= 4.0 and 1.0 <= al["b"] <= 5.0  # K+1 tokens per forward at most
    # the overall row is the pooled ratio of the two reports' own turns, paired by prompt
    ta = rep["pairs"]["bundle"]["requests"]
    assert sec["rows"][0]["turns"] == len(ta) == 4 and sec["unpaired_turns"] == {"a": 0, "b": 0}
    ov = sec["rows"][0]["acceptance_length"]
    assert ov["a"] == pytest.approx(rep["pairs"]["bundle"]["overall"]["acceptance_length"])
    assert ov["b"] == pytest.approx(sec["other_measurement"]["overall"]["acceptance_length"])
    # each side's predicted speedup is the cost model's at its AL, K and method, at --concurrency 4
    for side, b, k in (("a", fp8, 3), ("b", bf16, 4)):
        gpu, tp, tcost, dcost = model_costs(bundle_cost_inputs(open_bundle(b)))
        want = predict_from_tokens(ov[side], gpu, tcost, dcost, tp, 4, k, method="chain").speedup
        assert sec["rows"][0]["predicted_speedup"][side] == pytest.approx(want)
    # the per-concurrency table names a bundle and its K (or off) at each batch size, the concurrency included
    conc = {c["concurrency"]: c for c in sec["per_concurrency"]}
    assert 4 in conc and 1 in conc
    for c in conc.values():
        assert (c["deploy"] is None) == (c["k"] is None) and (c["deploy"] is None or c["predicted_speedup"] > 1)
        assert set(c["by_bundle"]) == {"tiny-fp8", "tiny-bf16-k4"}
    assert re.search(r"^deploy at concurrency 4: ", text, re.M) and sec["deploy"]["line"] in text
    assert (out / "against.txt").read_text().splitlines()[-1] == sec["deploy"]["line"]
    # the section is part of the typed report: read back by the one reader
    assert read_alpha_report(out / "report.json").against.deploy.line == sec["deploy"]["line"]
    # recommend on that report picks method and K per concurrency over both bundles again: the same table
    assert main(["recommend", str(fp8), "--report", str(out / "report.json"), "--concurrency", "4", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["evidence"]["method_choice"] == sec["per_concurrency"]


def test_against_refuses_another_target_in_one_line(bundles, prompts, tmp_path, capsys):
    fp8, _ = bundles
    t, d = make_pair(tmp_path / "pair", seed=7)
    other = build_bundle(
        EngineRequest(preset=load_preset("tiny"), target=str(t), draft=str(d), target_gpu="h100", out=str(tmp_path / "other"), dry_run=True)
    ).bundle
    out = tmp_path / "rep"
    assert main(["alpha", str(fp8), "--against", str(other), "--prompts", str(prompts), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "serves another target" in err[0] and str(other) in err[0] and "Traceback" not in err[0]
    assert not out.exists()  # nothing half-written


def test_against_refuses_options_it_does_not_read(bundles, prompts, capsys):
    fp8, bf16 = bundles
    assert main(["alpha", str(fp8), "--against", str(bf16), "--prompts", str(prompts), "--modes", "sa"]) == 2
    assert "--modes" in capsys.readouterr().err


def test_against_on_captured_traffic(bundles, tmp_path, capsys):
    """Captured requests (served by the FP8 bundle; 8 greedy in two categories, 2 sampled): both bundles
    measure the greedy ones on the token ids served, paired by request id; the sampled ones are left out."""
    fp8, bf16 = bundles
    held = json.loads((ROOT / "models/tiny/heldout_prompts.json").read_text())["prompts"]
    prompts = [p[:24] for p in held[:8]]
    greedy = served_records(fp8, prompts, max_tokens=12, categories=["prose" if n % 2 else "code" for n in range(8)], start_unix=1_000_000.0)
    sampled = served_records(fp8, [p[24:40] for p in held[:2]], max_tokens=8, temperature=0.8, seed=3, prefix="sampled", start_unix=1_000_100.0)
    traffic = write_traffic(tmp_path / "traffic", greedy + sampled)
    out = tmp_path / "cmp"
    rc = main(["alpha", str(fp8), "--against", str(bf16), "--traffic", str(traffic), "--concurrency", "2", "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    sec = json.loads((out / "against.json").read_text())
    assert [r["category"] for r in sec["rows"]] == ["overall", "code", "prose"]
    assert sec["rows"][0]["turns"] == 8 and sec["paired_by"].startswith("captured request")
    assert sec["deploy"]["line"] in text and "A = tiny-fp8 (chain, K=3), B = tiny-bf16-k4 (chain, K=4)" in text
    # the FP8 bundle's own offline figures on the traffic it served are the served ones (greedy: exact)
    served_tokens = sum(r.acceptance.completion_tokens for r in greedy)
    served_forwards = sum(r.acceptance.target_forwards for r in greedy)
    assert sec["rows"][0]["acceptance_length"]["a"] == pytest.approx(served_tokens / served_forwards)
    # an option the traffic form does not read is refused in one line
    assert main(["alpha", str(fp8), "--against", str(bf16), "--traffic", str(traffic), "--turns", "first"]) == 2
    assert "--turns" in capsys.readouterr().err


def test_against_p_eagle_prices_each_side_with_its_own_hook(bundles, prompts, tmp_path, capsys):
    """EAGLE-3 against the shipped tiny P-EAGLE head (models/tiny/draft-peagle): each side's predicted
    speedup is its own method's (P-EAGLE: one draft forward for K tokens), not the chain's at the same AL."""
    fp8, _ = bundles
    pe = build_bundle(
        EngineRequest(
            preset=load_preset("tiny"), draft=str(ROOT / "models/tiny/draft-peagle"), target_gpu="h100", calib_samples=4, out=str(tmp_path / "tiny-peagle")
        )
    ).bundle
    out = tmp_path / "rep"
    rc = main(["alpha", str(fp8), "--against", str(pe), "--prompts", str(prompts), "--max-tokens", "16", "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "B = tiny-peagle (peagle, K=3)" in text
    sec = json.loads((out / "report.json").read_text())["against"]
    al_b = sec["rows"][0]["acceptance_length"]["b"]
    gpu, tp, tcost, dcost = model_costs(bundle_cost_inputs(open_bundle(pe)))
    as_peagle = predict_from_tokens(al_b, gpu, tcost, dcost, tp, 1, 3, method="peagle")
    as_chain = predict_from_tokens(al_b, gpu, tcost, dcost, tp, 1, 3, method="chain")
    assert sec["rows"][0]["predicted_speedup"]["b"] == pytest.approx(as_peagle.speedup)
    assert as_peagle.t_spec_us < as_chain.t_spec_us  # two draft forwards fewer per iteration
    assert {c["method"] for c in sec["per_concurrency"] if c["deploy"] == "tiny-peagle"} <= {"peagle"}
