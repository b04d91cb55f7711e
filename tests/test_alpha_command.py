"""`eagle3-trt alpha`, `gate` and `recommend` on a real engine bundle (FP8 target, built by the pipeline).

The bundle's draft is the tiny pair's draft distilled onto the tiny target's greedy replies to
the first turns of a few MT-Bench prompts, so acceptance is far from zero; the FP8 target then
drifts from the BF16 one, which the side-by-side report has to show.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoTokenizer

from eagle3_trt.cli import main
from eagle3_trt.convert.load import load_engine
from eagle3_trt.convert.prompts import load_prompt_records
from eagle3_trt.errors import UserError
from eagle3_trt.formats.alpha_report import report_json
from eagle3_trt.measure.acceptance import encode_chat
from eagle3_trt.measure.alpha_run import run_alpha
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.pipeline.llm_options import LlmApiOptions
from eagle3_trt.pipeline.presets import load_preset
from eagle3_trt.testing.tiny_pair import make_draft
from eagle3_trt.train.export import save_draft
from eagle3_trt.train.trainer import distill_draft

ROOT = Path(__file__).resolve().parents[1]
MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench.jsonl"
N = 6


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    assert MT_BENCH.is_file(), f"{MT_BENCH} not found: a test using prompts_file (or bundle) lacks @pytest.mark.needs('shared')"
    lines = MT_BENCH.read_text().splitlines()
    # two categories, three records each
    cats: dict[str, list[str]] = {}
    for line in lines:
        cats.setdefault(json.loads(line)["category"], []).append(line)
    pick = [l for c in list(cats)[:2] for l in cats[c][:3]]
    f = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    f.write_text("\n".join(pick) + "\n")
    return f


@pytest.fixture(scope="module")
def bundle(tiny_pair_session, prompts_file, tmp_path_factory) -> Path:
    t, d = tiny_pair_session
    eng = load_engine(t, d, dtype=torch.float32, max_draft_len=3)
    recs = load_prompt_records(prompts_file)
    prompts = [encode_chat(eng.tokenizer, [{"role": "user", "content": r.turns[0]}]) for r in recs]
    distill_draft(eng, prompts, steps=150, lr=5e-3, gen_tokens=32, batch=6)
    tmp = tmp_path_factory.mktemp("distilled")
    ddir = save_draft(eng.draft, d, tmp / "draft")
    res = build_bundle(EngineRequest(preset=load_preset("tiny"), target=str(t), draft=str(ddir), target_gpu="h100", calib_samples=4, out=str(tmp / "bundle")))
    return res.bundle


def _best_k(rec: dict) -> int:
    """The K with the highest predicted speedup at the chosen concurrency (the smaller K on a tie),
    read from the recommendation's own table."""
    conc = rec["evidence"]["chosen_at_concurrency"]
    rows = [r for r in rec["table"] if r["batch"] == conc]
    return max(rows, key=lambda r: (r["speedup"], -r["k"]))["k"]


@pytest.mark.needs("shared")
def test_alpha_report_side_by_side(bundle, prompts_file, tmp_path, capsys):
    out = tmp_path / "rep"
    rc = main(["alpha", str(bundle), "--prompts", str(prompts_file), "--turns", "first", "--max-tokens", "24", "-o", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    rep = json.loads((out / "report.json").read_text())
    assert "overall" in text and "recommendation" in text, rep.get("recommendation_error")
    assert (out / "alpha.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "overall" in (out / "summary.txt").read_text()
    prim, ref = rep["pairs"]["bundle"], rep["pairs"]["reference"]
    assert prim["label"].startswith("fp8 target") and ref["label"].startswith("bf16 target")
    assert set(prim["by_category"]) == set(ref["by_category"]) and len(prim["by_category"]) == 2
    assert prim["overall"]["requests"] == N
    for p in (prim, ref):
        o = p["overall"]
        assert len(o["cumulative_acceptance"]) == len(o["conditional_acceptance"]) == 3
        assert o["alpha"] == pytest.approx(o["accepted_tokens"] / o["draft_tokens"])
        assert o["acceptance_length"] == pytest.approx(o["generated_tokens"] / o["target_forwards"])
        cats = p["by_category"].values()
        assert sum(c["accepted_tokens"] for c in cats) == o["accepted_tokens"]
    assert ref["overall"]["alpha"] > 0.5  # the draft was distilled on the BF16 target's replies
    assert rep["delta"]["overall"]["alpha"] == pytest.approx(prim["overall"]["alpha"] - ref["overall"]["alpha"])
    rec = rep["recommendation"]
    assert rec["max_draft_len"] == _best_k(rec) and rec["evidence"]["gpu"]["name"] == "h100"
    assert {r["k"] for r in rec["table"]} == {1, 2, 3}  # chosen among the bundle's K=3 positions
    assert rec["evidence"]["target"]["format"] == "fp8"
    assert {c["check"] for c in rep["diagnostics"]} >= {"d2t", "aux_layers", "draft_vocab_coverage"}


@pytest.mark.needs("shared")
def test_estimator_and_generation_agree_multi_turn(bundle, prompts_file):
    kw = dict(bf16=False, max_tokens=16, limit=3, turns="all", diagnostics=False)
    est = report_json(run_alpha(bundle, prompts_file, method="estimator", **kw))["pairs"]["bundle"]
    gen = report_json(run_alpha(bundle, prompts_file, method="generate", **kw))["pairs"]["bundle"]
    assert len(est["requests"]) == 6  # 3 records x 2 turns; turn 2 sees the target's own turn-1 reply
    assert est["requests"] == gen["requests"]
    assert est["overall"]["accepted_per_position"] == gen["overall"]["accepted_per_position"]


@pytest.mark.needs("shared")
def test_alpha_sweep_measures_each_draft_length(bundle, prompts_file, tmp_path, capsys):
    out = tmp_path / "rep"
    rc = main(
        [
            "alpha",
            str(bundle),
            "--prompts",
            str(prompts_file),
            "--turns",
            "first",
            "--max-tokens",
            "16",
            "--limit",
            "4",
            "--no-bf16",
            "--sweep",
            "1-2,4",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    assert "draft length sweep" in capsys.readouterr().out
    rep = json.loads((out / "report.json").read_text())
    sw = rep["pairs"]["bundle"]["sweep"]
    assert sorted(sw, key=int) == ["1", "2", "3", "4"]  # the bundle's K=3 is always measured
    kw = dict(bf16=False, max_tokens=16, limit=4, turns="first", diagnostics=False)
    for k in (1, 4):  # each swept K equals running speculative generation at that K
        gen = run_alpha(bundle, prompts_file, max_draft_len=k, method="generate", **kw).pairs.bundle.overall
        assert sw[str(k)]["acceptance_length"] == pytest.approx(gen.acceptance_length)
        assert sw[str(k)]["alpha"] == pytest.approx(gen.alpha)
    assert sw["1"]["predicted_acceptance_length"] == pytest.approx(1 + sw["1"]["alpha"], abs=0.15)
    for bad in ("0-2", "x", "3-1", "1-", "1,5-3"):
        assert main(["alpha", str(bundle), "--prompts", str(prompts_file), "--sweep", bad]) == 2
    with pytest.raises(UserError, match="estimator"):
        run_alpha(bundle, prompts_file, method="generate", sweep=(1, 2), **kw)


@pytest.mark.needs("shared")
def test_gate_pass_and_fail(bundle, prompts_file, tmp_path, capsys):
    args = ["gate", str(bundle), "--prompts", str(prompts_file), "--max-tokens", "24", "--turns", "all"]
    assert main(args + ["--threshold", "0.05"]) == 0
    assert "gate passed" in capsys.readouterr().out
    assert main(args + ["--threshold", "0.05", "--json"]) == 0
    alpha = json.loads(capsys.readouterr().out)["alpha"]
    assert 0.05 < alpha < 1  # second turns were not distilled on
    high = f"{(alpha + 1) / 2:.3f}"
    assert main(args + ["--threshold", high]) == 3
    cap = capsys.readouterr()
    # the verdict once: on stderr, from the CLI (it used to be printed by the command and again by the CLI)
    both = cap.out + cap.err
    assert both.count("gate FAILED") == 1 and both.count(f"< threshold {float(high):g}") == 1 and "gate failed" not in both
    assert cap.err.startswith(f"gate FAILED: {bundle}: alpha ")
    # the same bundle with the untrained draft: alpha ~ 0 and speculation predicted to slow it down
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    make_draft(broken / "draft")
    assert main(args[:1] + [str(broken)] + args[2:] + ["--json"]) == 3
    res = json.loads(capsys.readouterr().out)
    assert not res["passed"] and res["alpha"] < 0.05 and res["predicted_speedup"] < 1
    assert len(res["reasons"]) == 2


@pytest.mark.needs("shared")
def test_recommend_from_report(bundle, prompts_file, tmp_path, capsys):
    out = tmp_path / "rep"
    assert (
        main(
            [
                "alpha",
                str(bundle),
                "--prompts",
                str(prompts_file),
                "--turns",
                "first",
                "--max-tokens",
                "16",
                "--no-bf16",
                "--max-draft-len",
                "4",
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["recommend", str(bundle), "--report", str(out / "report.json"), "--gpu", "b200", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["evidence"]["gpu"]["name"] == "b200" and rec["max_draft_len"] == _best_k(rec)
    assert {r["k"] for r in rec["table"]} == {1, 2, 3, 4}


@pytest.mark.needs("shared")
def test_recommend_write_updates_options_and_manifest(bundle, prompts_file, tmp_path, capsys):
    b = tmp_path / "bundle"
    shutil.copytree(bundle, b)
    out = tmp_path / "rep"
    assert main(["alpha", str(b), "--prompts", str(prompts_file), "--turns", "first", "--max-tokens", "16", "--no-bf16", "-o", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["recommend", str(b), "--report", str(out / "report.json"), "--write", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    opts = yaml.safe_load((b / "llm_api_options.yaml").read_text())
    LlmApiOptions.model_validate(opts)
    spec = opts["speculative_config"]
    assert spec["max_draft_len"] == rec["max_draft_len"] and max(spec["draft_len_schedule"]) == rec["max_concurrency"] >= 1
    man = json.loads((b / "manifest.json").read_text())
    assert man["recommendation"]["max_concurrency"] == rec["max_concurrency"]
    assert {int(x): v for x, v in man["recommendation"]["draft_len_schedule"].items()} == spec["draft_len_schedule"]
    assert man["recommendation"]["cumulative_acceptance"] and man["fingerprint"]


def test_bad_prompt_file_is_a_user_error(fp8_bundle, tmp_path, capsys):
    """Any bundle will do (the prompt file is refused first): conftest's, which needs no ../shared."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\n{"category": "x"}\n')
    assert main(["alpha", str(fp8_bundle), "--prompts", str(bad)]) == 2
    assert f"{bad}:2" in capsys.readouterr().err


@pytest.mark.needs("shared")
def test_raw_completion_prompts_are_measured_without_the_chat_template(bundle, prompts_file, tmp_path, capsys):
    tok = AutoTokenizer.from_pretrained(open_bundle(bundle).tokenizer_dir)
    assert tok.chat_template  # the bundle's tokenizer has one: raw prompts must bypass it
    texts = ["def fibonacci(n):\n    ", "import numpy as np\n\nx = np.", "SELECT name FROM users WHERE"]
    raw = tmp_path / "code.jsonl"
    raw.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    kw = dict(bf16=False, max_tokens=12, turns="first", diagnostics=False)
    prim = run_alpha(bundle, raw, **kw).pairs.bundle
    assert prim.raw_prompts == len(texts)
    # as a /v1/completions request is encoded: no template, BOS as the tokenizer adds it by default
    want = [len(tok(t)["input_ids"]) for t in texts]
    assert [r.prompt_tokens for r in prim.requests] == want
    assert want != [len(encode_chat(tok, [{"role": "user", "content": t}])) for t in texts]
    # --chat-template sends the same records as user turns
    chat = run_alpha(bundle, raw, chat_template=True, **kw).pairs.bundle
    assert chat.raw_prompts == 0 and [r.prompt_tokens for r in chat.requests] != want
    # plain-text lines are user turns by default and raw with --no-chat-template (CLI, summary says so)
    lines = tmp_path / "code.txt"
    lines.write_text("import os\nclass Stack:\n")
    out = tmp_path / "rep"
    assert (
        main(["alpha", str(bundle), "--prompts", str(lines), "--no-chat-template", "--no-bf16", "--turns", "first", "--max-tokens", "8", "-o", str(out)]) == 0
    )
    assert "2 of 2 prompts measured as raw completion text" in capsys.readouterr().out
    rep = json.loads((out / "report.json").read_text())
    assert rep["settings"]["chat_template"] == "never"
    assert [r["prompt_tokens"] for r in rep["pairs"]["bundle"]["requests"]] == [len(tok(t)["input_ids"]) for t in ("import os", "class Stack:")]


@pytest.mark.needs("shared")
def test_no_chat_template_refuses_chat_records_in_one_line(bundle, prompts_file, capsys):
    for cmd in (["alpha"], ["gate"], ["recommend"]):
        assert main(cmd + [str(bundle), "--prompts", str(prompts_file), "--no-chat-template"]) == 2
        err = capsys.readouterr().err.strip()
        assert "is a chat record" in err and "--no-chat-template" in err and len(err.splitlines()) == 1, err
