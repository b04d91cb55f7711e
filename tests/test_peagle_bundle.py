"""The shipped tiny P-EAGLE head (models/tiny/draft-peagle, trained with `train-draft --method peagle`) and
its bundle: validated like an EAGLE-3 head plus its own line, built into a bundle for the engine that serves
it (vLLM's parallel drafting), refused in one line where TensorRT-LLM would run it (compile, Triton, Dynamo), and
measured by the reference runtime through speculative/peagle, the estimator agreeing with generation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3_trt.cli import main
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.presets import load_preset
from eagle3_trt.runtime.loader import engine_from_bundle
from eagle3_trt.speculative.peagle.draft import PEagleDraft
from eagle3_trt.speculative.peagle.method import PEagleMethod

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny"
HEAD = TINY / "draft-peagle"


def one_line_refusal(rc: int, err: str, *words: str) -> None:
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert all(w in err for w in words), err


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    req = EngineRequest(preset=load_preset("tiny"), target=str(TINY / "target"), draft=str(HEAD), target_gpu="h100", calib_samples=4)
    return build_bundle(EngineRequest(**{**req.__dict__, "out": str(tmp_path_factory.mktemp("b") / "peagle")})).bundle


def test_shipped_head_validates_with_its_behaviour(capsys):
    assert main(["validate", "--target", str(TINY / "target"), "--draft", str(HEAD), "--deep", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    checks = {c["check"]: c["detail"] for c in rep["checks"]}
    assert checks["method"].startswith("P-EAGLE head: mask_token_id")
    assert {"shapes", "aux_layers", "vocab_map", "behaviour"} <= set(checks)
    assert rep["behaviour"]["draft_agreement"] > 0.15  # far above chance (1/1024), on the calibration chats
    assert all(a > 0.05 for a in rep["behaviour"]["later_slot_agreement"])  # the trained mask slots, 2 and 3 (50x chance)
    assert not rep["warnings"]


def test_bad_heads_refused_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(HEAD, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["mask_token_id"] = 4096  # the tiny target has 2048 tokens
    (bad / "config.json").write_text(json.dumps(cfg))
    rc = main(["validate", "--target", str(TINY / "target"), "--draft", str(bad)])
    one_line_refusal(rc, capsys.readouterr().err, "config.json:mask_token_id", "outside")
    cfg["mask_token_id"] = 5
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 4, 9]  # vLLM ids: layer 8 of an 8-layer target
    (bad / "config.json").write_text(json.dumps(cfg))
    rc = main(["validate", "--target", str(TINY / "target"), "--draft", str(bad)])
    one_line_refusal(rc, capsys.readouterr().err, "eagle_aux_hidden_state_layer_ids")


def test_build_refusals(tmp_path, capsys):
    base = ["engine", "--model", "tiny", "--target", str(TINY / "target"), "--draft", str(HEAD), "--out", str(tmp_path / "b")]
    one_line_refusal(main([*base, "--dry-run"]), capsys.readouterr().err, "--dry-run", "peagle")
    one_line_refusal(main([*base, "--quantize-draft", "--draft-quant", "fp8"]), capsys.readouterr().err, "--quantize-draft", "P-EAGLE")
    assert not (tmp_path / "b").exists()


def test_bundle_records_method_and_serving_engines(bundle):
    man = json.loads((bundle / "manifest.json").read_text())
    assert man["method"] == "peagle" and man["quant"]["target"] == "fp8" and man["quant"]["draft"] == "bf16"
    assert man["served_by"]["vllm"] == {"method": "eagle3", "model": "draft", "num_speculative_tokens": 3, "parallel_drafting": True}
    assert man["served_by"]["tensorrt_llm"]["served"] is False and man["served_by"]["sglang"]["served"] is False
    assert sorted(p.name for p in (bundle / "launch").iterdir()) == ["README.md", "vllm.sh"]
    script = (bundle / "launch" / "vllm.sh").read_text()
    spec = json.loads(script.split("printf '", 1)[1].split("'", 1)[0].replace("%s", "DRAFT"))
    assert spec == {"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": 3, "parallel_drafting": True}
    draft_cfg = json.loads((bundle / "draft" / "config.json").read_text())
    assert draft_cfg["speculators_model_type"] == "peagle"  # shipped as speculators saved it: what vLLM reads
    eng = engine_from_bundle(bundle, device="cpu")
    assert isinstance(eng.method, PEagleMethod) and isinstance(eng.draft, PEagleDraft)


def test_trtllm_paths_refuse_it_in_one_line(bundle, tmp_path, capsys):
    rc = main(["compile", str(bundle), "--check-only", "--target-gpu", "h100"])
    one_line_refusal(rc, capsys.readouterr().err, "speculative_config", "no TensorRT-LLM release serves P-EAGLE")
    rc = main(["package", str(bundle), "-o", str(tmp_path / "repo")])
    one_line_refusal(rc, capsys.readouterr().err, "speculative_config", "no TensorRT-LLM release serves P-EAGLE")
    assert not (tmp_path / "repo").exists()


def test_alpha_measures_peagle_estimator_equals_generation(bundle, tmp_path):
    held = json.loads((TINY / "heldout_prompts.json").read_text())
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps({**held, "prompts": [p[:32] for p in held["prompts"][:3]]}))
    reps = {}
    for method in ("estimator", "generate"):
        out = tmp_path / method
        args = ["alpha", str(bundle), "--prompts", str(prompts), "--max-tokens", "24", "--no-bf16", "--device", "cpu", "--method", method, "-o", str(out)]
        assert main(args) == 0
        reps[method] = json.loads((out / "report.json").read_text())["pairs"]["bundle"]["overall"]
    est, gen = reps["estimator"], reps["generate"]
    for key in ("accepted_tokens", "draft_tokens", "target_forwards", "accepted_per_position"):
        assert est[key] == gen[key], key
    assert est["accepted_per_position"][1] > 0  # the trained mask slots (draft token 2) are accepted too


def test_a_draft_alone_runs_with_the_embedded_target_into_its_own_dir(tmp_path):
    from eagle3_trt.pipeline.builder import default_bundle_dir, resolve_pair

    target, draft = resolve_pair(EngineRequest(preset=load_preset("tiny"), draft=str(HEAD)))
    assert target.resolve() == (TINY / "target").resolve() and draft.resolve() == HEAD.resolve()
    assert default_bundle_dir("tiny", "fp8", "h100", tmp_path, method="peagle") == tmp_path / "engines" / "tiny-peagle-fp8-h100"
    assert default_bundle_dir("tiny", "fp8", "h100", tmp_path) == tmp_path / "engines" / "tiny-fp8-h100"


def test_dynamo_refuses_it_in_one_line(bundle, tmp_path, capsys):
    """Dynamo's workers run TensorRT-LLM's backend (or the reference runtime predicting it): serve-dynamo
    refuses the bundle before it starts anything, as compile and Triton do."""
    state = tmp_path / "dyn"
    rc = main(["serve-dynamo", str(bundle), "--state-dir", str(state), "--workers", "1"])
    one_line_refusal(rc, capsys.readouterr().err, "speculative_config", "Dynamo serving", "no TensorRT-LLM release serves P-EAGLE")
    assert not (state / "frontend.log").exists()
