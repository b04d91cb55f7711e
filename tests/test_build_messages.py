"""What a build says it measured and what it got (issue 21 D): a calibration shortfall, the gate
verdict on the build's own held-out check (and the `alpha` command that reruns it), what
`validate` checks by default, verdicts printed once, and benchmarks that label their data."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_trt.cli import main
from eagle3_trt.convert.prompts import SHIPPED_PROMPTS

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = REPO_ROOT / "models" / "tiny"
HELDOUT = TINY / "heldout_prompts.json"


def _cli(*args: str, cwd: Path = REPO_ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def short_build(tmp_path_factory):
    """`eagle3-trt engine --model tiny` (the embedded pair, so the build measures acceptance) on a
    3-prompt calibration file, where the preset asks for 16."""
    tmp = tmp_path_factory.mktemp("short-calib")
    calib = tmp / "calib.jsonl"
    # 3 of the shipped prompts (the build's behaviour check needs text the tiny target knows)
    calib.write_text("".join(SHIPPED_PROMPTS.read_text().splitlines(keepends=True)[:3]))
    r = _cli("engine", "--model", "tiny", "--target-gpu", "h100", "--calib", str(calib), "-o", str(tmp / "bundle"))
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp / "bundle", r


def test_calibration_shortfall_is_one_warning_and_recorded(short_build):
    bundle, r = short_build
    cal = json.loads((bundle / "manifest.json").read_text())["calibration"]
    assert cal["num_samples"] == 16 and cal["prompts_used"] == 3 and cal["tokens"] > 0
    assert cal["shortfall"] == (
        f"calibration asked for 16 prompts x up to 64 tokens (1,024 tokens) but calib.jsonl has 3 prompts: calibrated on {cal['tokens']:,} tokens"
    )
    lines = [x for x in r.stderr.splitlines() if "calibration asked for" in x]
    assert len(lines) == 1, r.stderr
    assert (
        lines[0].strip()
        == f"warning: {cal['shortfall']} (pass --calib FILE with that many prompts like your traffic (JSONL or one prompt a line), or --calib-samples N to ask for fewer)"
    )


def test_the_shipped_set_meets_the_tiny_preset(tmp_path):
    """No warning and no shortfall field where the file holds what the preset asks for (16 of 48)."""
    from eagle3_trt.convert.prompts import SHIPPED_PROMPTS, load_prompts
    from eagle3_trt.pipeline.bundle import Calibration, calibration_shortfall
    from eagle3_trt.pipeline.presets import load_preset

    for name in ("tiny", "tiny-qwen3", "tiny-gpt-oss"):
        n = load_preset(name).calibration.num_samples
        assert len(load_prompts(SHIPPED_PROMPTS, n)) == n
    full = Calibration(file="x", sha256=None, num_samples=16, max_length=64, prompts_used=16, tokens=700)
    assert calibration_shortfall(full) is None
    assert calibration_shortfall(full.model_copy(update={"prompts_used": None})) is None  # nothing calibrated


def test_plan_says_a_512_prompt_preset_needs_your_data():
    r = _cli("plan", "llama3.3-70b", "--gpus", "8")
    assert r.returncode == 0, r.stderr
    step = next(x for x in r.stdout.splitlines() if "calibrate + quantize" in x)
    assert "512x512 calibration tokens" in step and "needs your calibration data: the shipped set has 48 prompts, so pass --calib FILE with 512" in step
    assert "needs your data" in (REPO_ROOT / "build" / "presets" / "llama3.3-70b.yaml").read_text()


def test_build_ends_with_the_gate_verdict_on_its_own_check(short_build):
    from eagle3_trt.measure.gate_verdict import DEFAULT_GATE_THRESHOLD, alpha_shortfall

    bundle, r = short_build
    acc = json.loads((bundle / "manifest.json").read_text())["acceptance"]
    last = r.stderr.strip().splitlines()[-1].strip()
    verdict = "PASS" if alpha_shortfall(acc["alpha"]) is None else "FAIL"
    assert last.startswith(f"gate: {verdict}: alpha {acc['alpha']:.3f} ")
    assert f"threshold {DEFAULT_GATE_THRESHOLD:g}" in last and "held-out prompts" in last
    assert r.stderr.count("gate: ") == 1


def test_alpha_on_the_heldout_file_reproduces_the_build(short_build, tmp_path):
    """The command the verdict line prints measures exactly what the build measured."""
    bundle, r = short_build
    acc = json.loads((bundle / "manifest.json").read_text())["acceptance"]
    rerun = re.search(r"rerun this check: (eagle3-trt alpha [^)]*)\)", r.stderr.splitlines()[-1]).group(1)
    argv = shlex.split(rerun)[1:]
    assert argv[2:] == ["--prompts", "models/tiny/heldout_prompts.json", "--limit", "8", "--max-tokens", "32"]
    out = _cli(*argv, "--no-bf16", "--json", "-o", str(tmp_path / "rep"))
    assert out.returncode == 0, out.stderr
    o = json.loads(out.stdout)["pairs"]["bundle"]["overall"]
    assert o["requests"] == acc["prompts"] and o["generated_tokens"] == acc["generated_tokens"] and o["target_forwards"] == acc["target_forwards"]
    assert round(o["alpha"], 4) == acc["alpha"] and round(o["acceptance_length"], 4) == acc["acceptance_length"]


def test_gate_reports_the_shortfall_and_its_verdict_once(short_build, capsys):
    bundle, _ = short_build
    args = ["gate", str(bundle), "--prompts", str(HELDOUT), "--limit", "2", "--max-tokens", "8", "--threshold", "0.99"]
    assert main(args) == 3
    cap = capsys.readouterr()
    both = cap.out + cap.err
    assert both.count("gate FAILED") == 1 and both.count("< threshold 0.99") == 1 and "gate failed" not in both
    assert cap.out.count("warning: calibration asked for 16 prompts") == 1
    assert main([*args, "--json"]) == 3
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert res["calibration_shortfall"].startswith("calibration asked for 16 prompts") and not res["passed"]
    assert cap.err.count("gate FAILED") == 1 and len(cap.err.strip().splitlines()) == 1


def test_heldout_file_is_for_measurements_only(tmp_path, capsys):
    """Token ids cannot calibrate (text) nor go through a chat template: one line each."""
    out = tmp_path / "b"
    assert main(["engine", "--model", "tiny", "--target-gpu", "h100", "--calib", str(HELDOUT), "--dry-run", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {HELDOUT}: holds token ids (a held-out prompts file), not text (hint: pass --calib a text") and len(err.splitlines()) == 1
    assert not out.exists()


def test_validate_checks_what_the_build_uses(capsys):
    t, d = str(TINY / "target"), str(TINY / "draft")
    assert main(["validate", "--target", t, "--draft", d]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("for   max_seq_len 512 (preset tiny's, what `eagle3-trt engine --model tiny")
    assert "8192" not in out and "warn" not in out  # tiny's 4096-position models cover 512
    assert main(["validate", "--target", t, "--draft", d, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["max_seq_len"] == 512 and rep["warnings"] == []
    # a longer context than the target was trained on: the build refuses it, validate says so
    assert main(["validate", "--target", t, "--draft", d, "--max-seq-len", "8192"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "for   max_seq_len 8192 (--max-seq-len)"
    warn = [x for x in out.splitlines() if x.startswith("warn  target ")]
    assert warn == [
        f"warn  target max_position_embeddings 4096 < max_seq_len 8192 ({Path(t) / 'config.json'}): "
        "`eagle3-trt engine` refuses this length; build with --max-seq-len 4096 or less"
    ]
    assert main(["validate", "--target", t, "--draft", d, "--model", "llama3.1-8b"]) == 0
    assert "for   max_seq_len 8192 (preset llama3.1-8b's" in capsys.readouterr().out


def test_validate_target_warning_matches_the_build_refusal(tmp_path, capsys):
    """What validate warns about, `engine` refuses, naming the same limit."""
    out = tmp_path / "b"
    assert main(["engine", "--model", "tiny", "--target-gpu", "h100", "--max-seq-len", "8192", "--dry-run", "-o", str(out)]) == 2
    assert "8192 exceeds the target's max_position_embeddings (4096)" in capsys.readouterr().err


def test_alpha_estimator_bench_labels_random_prompts_as_such(tmp_path, monkeypatch, capsys):
    """Without ../shared the MT-Bench set is random token ids: labelled [random-ids], never [mt-bench]."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_alpha_estimator", REPO_ROOT / "benchmarks" / "bench_alpha_estimator.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "ROOT", tmp_path / "repo")  # no ../shared next to it
    label, prompts = mod.chat_prompts(None, 4)
    assert label == "random-ids" and len(prompts) == 4 and "labelled [random-ids]" in capsys.readouterr().out
    r = subprocess.run(
        [sys.executable, "benchmarks/bench_alpha_estimator.py", "--sets", "mt_bench"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "unknown set(s) mt_bench" in r.stderr and "pair:" not in r.stdout


def test_engine_bench_refuses_more_samples_than_the_set_holds():
    r = subprocess.run([sys.executable, "benchmarks/bench_engine.py", "--samples", "100"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "has 48 prompts; pass --samples 48 or less" in r.stderr.strip().splitlines()[-1]
