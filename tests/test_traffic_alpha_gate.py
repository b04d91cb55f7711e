"""`alpha BUNDLE --traffic DIR` and `gate NEW --against OLD --traffic DIR` (issue 23 B, D) on real traffic.

The traffic is real: held-out token windows of the embedded tiny pair sent through ReferenceLLM
(the object the Triton model and the Dynamo worker drive), each finished request recorded with
the acceptance the server reported and written through SegmentWriter, as serve --capture does.
OLD is the tiny pair with its head damaged (noise on every draft matrix), built by the normal
pipeline; NEW is the shipped head. OLD serves the traffic.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_trt.cli import main
from eagle3_trt.core.paired_ci import paired_ratio_diff
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.pipeline.presets import load_preset
from eagle3_trt.testing.behaviour_cases import copy_embedded
from eagle3_trt.testing.served_traffic import served_records, write_traffic

_ALL_HELD = json.loads((Path(__file__).resolve().parents[1] / "models" / "tiny" / "heldout_prompts.json").read_text())["prompts"]


def _distinct_windows(prompts: list[list[int]], n: int) -> list[list[int]]:
    """The first ``n`` held-out prompts whose 24-token windows no earlier one has (paste prompts share openings)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for p in prompts:
        w = {tuple(p[a : a + 24]) for a in (0, 24, 48)}
        if len(w) == 3 and not w & seen:
            seen |= w
            out.append(p)
    return out[:n]


# 32 of the embedded pair's held-out prompts (code windows and paste prompts): 64 greedy requests, each a distinct prompt
HELD = _distinct_windows(_ALL_HELD, 32)


def _bundle(tmp: Path, damage: float | None) -> Path:
    t, d = copy_embedded("tiny", tmp / "pair")
    if damage:
        sd = load_file(str(d / "model.safetensors"))
        g = torch.Generator().manual_seed(0)
        for k, v in sd.items():
            if v.dtype == torch.bfloat16 and v.dim() == 2:
                f = v.float()
                sd[k] = (f + damage * f.std() * torch.randn(f.shape, generator=g)).to(torch.bfloat16)
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    req = EngineRequest(preset=load_preset("tiny"), target=str(t), draft=str(d), target_gpu="h100", quant="bf16", out=str(tmp / "bundle"))
    return build_bundle(req).bundle


@pytest.fixture(scope="module")
def new_bundle(tmp_path_factory) -> Path:
    return _bundle(tmp_path_factory.mktemp("new"), None)


@pytest.fixture(scope="module")
def old_bundle(tmp_path_factory) -> Path:
    return _bundle(tmp_path_factory.mktemp("old"), 0.3)


@pytest.fixture(scope="module")
def served(old_bundle) -> list:
    """64 greedy requests (two 24-token windows of each held-out text) and 6 sampled ones, served by OLD."""
    prompts = [p[:24] for p in HELD] + [p[24:48] for p in HELD]
    cats = ["prose" if n % 3 else "code" for n in range(len(prompts))]
    greedy = served_records(old_bundle, prompts, max_tokens=16, categories=cats, start_unix=1_000_000.0)
    sampled = served_records(old_bundle, [p[48:64] for p in HELD[:6]], max_tokens=16, temperature=0.8, seed=7, prefix="sampled", start_unix=1_000_100.0)
    return greedy + sampled


@pytest.fixture(scope="module")
def traffic(served, tmp_path_factory) -> Path:
    return write_traffic(tmp_path_factory.mktemp("capture") / "traffic", served)


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_paired_interval_is_zero_for_identical_figures_and_covers_a_real_gain():
    same = paired_ratio_diff([10, 20, 7], [5, 8, 7], [10, 20, 7], [5, 8, 7])
    assert (same.diff, same.lo, same.hi) == (0.0, 0.0, 0.0) and not same.excludes_zero_by(0.0)
    # A: 2 tokens per forward on every request, B: 1.5: the gain is 0.5 on every resample
    gain = paired_ratio_diff([20] * 30, [10] * 30, [15] * 30, [10] * 30)
    assert gain.lo == pytest.approx(0.5) and gain.hi == pytest.approx(0.5) and gain.excludes_zero_by(0.4) and not gain.excludes_zero_by(0.5)


def test_alpha_traffic_equals_the_served_figures(old_bundle, traffic, tmp_path, capsys):
    rc, out, err = _cli(["alpha", str(old_bundle), "--traffic", str(traffic), "--device", "cpu", "-o", str(tmp_path / "rep"), "--window", "20"], capsys)
    assert rc == 0, out + err
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    c = rep["comparison"]
    # every greedy request: the same tokens, target forwards and output as the server reported
    assert c["greedy"] == {"requests": 64, "identical": 64, "differ": []}
    assert c["sampled"] == 6 and c["n"] == 70 and c["prompts"] == 70  # every window a distinct prompt
    # the live check: served AL inside the interval printed around the offline AL (greedy part exact)
    assert c["ci"][0] <= 0.0 <= c["ci"][1] and not c["beyond_sampling_noise"]
    line = next(ln for ln in out.splitlines() if ln.startswith("offline vs served: "))
    assert f"AL {c['offline_acceptance_length']:.4f} vs {c['served_acceptance_length']:.4f}" in line
    assert "(70 requests from 70 distinct prompts): within sampling noise (tolerance 0.02)" in line
    # per-K figures from the estimator replay, AL rising with K; the drift windows and categories
    assert list(rep["per_k"]) == ["1", "2", "3"]
    als = [rep["per_k"][k]["acceptance_length"] for k in ("1", "2", "3")]
    assert 1.0 < als[0] < als[1] < als[2]
    assert rep["drift"]["window"] == 20 and [w["requests"] for w in rep["drift"]["windows"]] == [20, 20, 20, 10]
    assert set(rep["drift"]["by_category"]) == {"code", "prose"}
    assert "served AL by category: code" in out


def test_alpha_traffic_flags_figures_another_bundle_produced(new_bundle, served, tmp_path, capsys):
    """The served figures came from OLD's damaged head but the records name NEW: beyond noise, exit 3."""
    fp = open_bundle(new_bundle).manifest.fingerprint
    wrong = write_traffic(tmp_path / "traffic", [r.model_copy(update={"bundle_fingerprint": fp}) for r in served])
    rc, out, err = _cli(["alpha", str(new_bundle), "--traffic", str(wrong), "--device", "cpu", "-o", str(tmp_path / "rep")], capsys)
    assert rc == 3, out + err
    c = json.loads((tmp_path / "rep" / "report.json").read_text())["comparison"]
    assert c["beyond_sampling_noise"] and c["ci"][0] > 0.02 and c["greedy"]["identical"] < c["greedy"]["requests"]
    assert "BEYOND SAMPLING NOISE (tolerance 0.02)" in out


def test_alpha_traffic_counts_requests_of_other_bundles(new_bundle, old_bundle, served, tmp_path, capsys):
    fp = open_bundle(new_bundle).manifest.fingerprint
    mixed = write_traffic(tmp_path / "traffic", [r.model_copy(update={"bundle_fingerprint": fp}) for r in served[:5]] + served[5:30])
    rc, out, err = _cli(["alpha", str(old_bundle), "--traffic", str(mixed), "--device", "cpu", "-o", str(tmp_path / "rep")], capsys)
    assert rc == 0, out + err
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["compared"] == 25 and rep["skipped"]["other_bundles"] == {fp[:12]: 5}
    assert f"skipped: 5 served by other bundles ({fp[:12]} 5)" in out


def test_gate_passes_a_better_head_and_writes_its_report(new_bundle, old_bundle, traffic, tmp_path, capsys):
    js = tmp_path / "gate.json"
    argv = ["gate", str(new_bundle), "--against", str(old_bundle), "--traffic", str(traffic), "--holdout-fraction", "0.5", "--device", "cpu"]
    rc, out, err = _cli([*argv, "--json-out", str(js)], capsys)
    assert rc == 0, out + err
    res = json.loads(js.read_text())
    g = res["acceptance_length_gain"]
    assert res["passed"] and g["ci"][0] > g["margin"] == 0.05 and g["n_groups"] >= 20 and g["n"] >= g["n_groups"]
    assert res["lossless"]["not_lossless"] == [] and res["lossless"]["differs_from_old"] == [] and res["lossless"]["greedy_requests"] > 0
    assert res["seeds_gate"]["holds"]
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith(f"gate: PASS new AL {g['a']:.3f} vs old {g['b']:.3f} ({g['diff']:+.3f}, 95% CI [")
    assert f"margin 0.05, on {g['n']} held-back requests from {g['n_groups']} distinct prompts of {traffic}" in verdict
    # how many distinct prompt groups it judged on: printed before the verdict and recorded
    t = res["traffic"]
    assert t["judged_prompt_groups"] == g["n_groups"] and t["groups"] >= t["judged_prompt_groups"]
    assert f"judging on {g['n']} held-back requests from {g['n_groups']} distinct prompt groups (of {t['groups']} groups in {t['records']} records)" in err


def test_gate_fails_a_head_against_itself(old_bundle, traffic, tmp_path, capsys):
    js = tmp_path / "gate.json"
    argv = ["gate", str(old_bundle), "--against", str(old_bundle), "--traffic", str(traffic), "--holdout-fraction", "0.5", "--device", "cpu"]
    rc, out, err = _cli([*argv, "--json-out", str(js)], capsys)
    assert rc == 3, out + err
    res = json.loads(js.read_text())
    assert not res["passed"] and res["acceptance_length_gain"]["ci"] == [0.0, 0.0]
    assert any("not above the margin 0.05" in r for r in res["reasons"])
    assert out.strip().splitlines()[-1].startswith("gate: FAIL new AL ")


def test_truncated_segment_is_one_line(old_bundle, traffic, tmp_path, capsys):
    bad = tmp_path / "traffic"
    shutil.copytree(traffic, bad)
    seg = sorted(bad.glob("traffic-*.jsonl"))[1]
    seg.write_bytes(seg.read_bytes()[:-40])
    rc, out, err = _cli(["alpha", str(old_bundle), "--traffic", str(bad), "-o", str(tmp_path / "rep")], capsys)
    assert rc == 2 and err.strip().splitlines() == [
        f"error: {seg}: ends in the middle of a record (truncated) (hint: remove or restore the segment; the writer never leaves one like this)"
    ]
    assert not (tmp_path / "rep").exists()


def test_a_request_cut_at_a_stop_string_is_compared_exactly(old_bundle, served, tmp_path, capsys):
    """The server stops at a stop string mid-step (ReferenceLLM trims the step's later tokens): measured up
    to the served length, the same forwards produce the same tokens."""
    text = served[0].output_text
    # two characters from the middle on that are not blank and first occur there, so the server stops there
    at = next(i for i in range(len(text) // 2, len(text) - 1) if text[i : i + 2].strip() and text.find(text[i : i + 2]) == i)
    stop = text[at : at + 2]
    cut = served_records(old_bundle, [served[0].prompt_ids], max_tokens=16, stop=stop, prefix="cut")
    assert cut[0].finish_reason == "stop" and len(cut[0].output_ids) < 16
    d = write_traffic(tmp_path / "traffic", cut + served[1:4])
    rc, out, err = _cli(["alpha", str(old_bundle), "--traffic", str(d), "--device", "cpu", "-o", str(tmp_path / "rep")], capsys)
    assert rc == 0, out + err
    c = json.loads((tmp_path / "rep" / "report.json").read_text())["comparison"]
    assert c["greedy"] == {"requests": 4, "identical": 4, "differ": []} and c["ci"] == [0.0, 0.0]


def test_recommend_replays_the_captured_requests_for_the_acceptance_gate(old_bundle, new_bundle, traffic, tmp_path, capsys):
    """alpha --traffic keeps each greedy request's accepted drafts per verification at every K it replayed;
    recommend --gate-traffic chooses the gate's window by replaying those (measure/gate_replay.py), and
    refuses another bundle's report in one line."""
    rc, out, err = _cli(["alpha", str(old_bundle), "--traffic", str(traffic), "--device", "cpu", "-o", str(tmp_path / "rep")], capsys)
    assert rc == 0, out + err
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert len(rep["requests"]) == 64 and all(set(r["accepted_seq_by_k"]) == {"1", "2", "3"} for r in rep["requests"])
    for k in ("1", "2", "3"):  # the sequences add up to the per-K figures printed
        acc = sum(sum(r["accepted_seq_by_k"][k]) for r in rep["requests"])
        drafted = sum(len(r["accepted_seq_by_k"][k]) for r in rep["requests"]) * int(k)
        # the last verifications may draft fewer than K (16-token requests: up to 3 %)
        assert acc / drafted == pytest.approx(rep["per_k"][k]["alpha"], abs=0.03)
    code = Path(__file__).resolve().parents[1] / "examples" / "code.jsonl"
    argv = ["recommend", str(old_bundle), "--prompts", str(code), "--limit", "4", "--max-tokens", "16", "--device", "cpu"]
    rc, out, err = _cli([*argv, "--gate-traffic", str(tmp_path / "rep" / "report.json")], capsys)
    assert rc == 0, out + err
    line = next(ln for ln in out.splitlines() if ln.startswith("acceptance gate:"))
    assert "drawn from the 64 measured requests at K=" in line and f"measured on captured traffic {traffic}" in line
    rc, out, err = _cli([*argv[:1], str(new_bundle), *argv[2:], "--gate-traffic", str(tmp_path / "rep" / "report.json")], capsys)
    assert rc == 2 and "its acceptance is another head's" in err and len(err.strip().splitlines()) == 1
