"""`eagle3-trt compile` and `plan`: the parts that run without a GPU (manifest record, GPU/format
refusals with --target-gpu, acceptance arithmetic, CLI), and the real compile where TensorRT-LLM
and a GPU exist."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle3_trt.cli import main as cli_main
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline import bundle as fmt
from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline import compile as comp
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.gpu_checks import check_formats, detect_gpu, gpu_key
from eagle3_trt.pipeline.presets import load_preset


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """Dry-run bundles from the real builder (configs only): FP8 for Hopper, NVFP4 for Blackwell."""
    root = tmp_path_factory.mktemp("compile")
    fp8 = build_bundle(EngineRequest(preset=load_preset("llama3.1-8b"), out=str(root / "fp8"), dry_run=True, quant="fp8", target_gpu="h100")).bundle
    nvfp4 = build_bundle(EngineRequest(preset=load_preset("llama3.3-70b"), out=str(root / "nvfp4"), dry_run=True, quant="nvfp4", target_gpu="b200")).bundle
    return {"fp8": fp8, "nvfp4": nvfp4}


@pytest.fixture
def fp8_copy(bundles, tmp_path) -> Path:
    dst = tmp_path / "b"
    shutil.copytree(bundles["fp8"], dst)
    return dst


# --- GPU identity and formats ----------------------------------------------------------------


def test_gpu_names_map_to_known_keys():
    assert gpu_key("NVIDIA H100 80GB HBM3", 90) == "h100"
    assert gpu_key("NVIDIA H200", 90) == "h200"
    assert gpu_key("NVIDIA B200", 100) == "b200"
    assert gpu_key("NVIDIA GB200", 100) == "gb200"  # not b200, although the name contains it
    assert gpu_key("NVIDIA A100-SXM4-80GB", 80) == "a100"
    assert gpu_key("NVIDIA RTX PRO 6000 Blackwell", 120) == "b200"  # unknown board: by compute capability


@pytest.mark.needs("no_cuda")
def test_detect_gpu_is_none_without_cuda():
    assert detect_gpu() is None


def test_format_rules():
    check_formats({"target": "fp8", "draft": "bf16", "kv_cache": "fp8"}, 89, "l40s")
    check_formats({"target": "nvfp4", "draft": "nvfp4", "kv_cache": "fp8"}, 120, "rtx")
    with pytest.raises(UserError) as e:
        check_formats({"target": "bf16", "draft": "fp8", "kv_cache": "auto"}, 80, "a100")
    assert e.value.where.endswith("quant.draft") and "SM80" in e.value.what
    with pytest.raises(UserError) as e:
        check_formats({"target": "fp8", "draft": "bf16", "kv_cache": "nvfp4"}, 90, "h100")
    assert e.value.where.endswith("quant.kv_cache") and "Blackwell" in e.value.what
    with pytest.raises(UserError) as e:
        check_formats({"target": "bf16", "draft": "bf16", "kv_cache": "auto"}, 75, "t4")
    assert "Ampere" in e.value.hint


# --- preflight on CPU ---------------------------------------------------------------------------


def test_nvfp4_bundle_is_refused_for_hopper(bundles):
    with pytest.raises(UserError) as e:
        comp.preflight(bundles["nvfp4"], "h100", require_runtime=False)
    assert "nvfp4" in e.value.what and "Blackwell" in e.value.what and "--quant fp8" in e.value.hint
    pf = comp.preflight(bundles["nvfp4"], "b200", require_runtime=False)
    assert pf.gpu.sm == 100 and any("nvfp4" in c for c in pf.checks)


def test_fp8_bundle_checks_on_hopper_and_blackwell_not_ampere(bundles):
    for gpu in ("h100", "h200", "b200"):
        pf = comp.preflight(bundles["fp8"], gpu, require_runtime=False)
        assert pf.llm is not None and "option names" in " ".join(pf.checks)
    with pytest.raises(UserError):
        comp.preflight(bundles["fp8"], "a100", require_runtime=False)
    # Without --target-gpu and without a GPU, the bundle is checked against the GPU it was built for.
    pf = comp.preflight(bundles["nvfp4"], None, require_runtime=False)
    assert "bundle's target_gpu" in pf.gpu.label and pf.gpu.sm == 100


def test_target_gpu_must_match_the_gpu_present(bundles):
    from eagle3_trt.pipeline.gpu_checks import DetectedGpu

    h100 = DetectedGpu("NVIDIA H100 80GB HBM3", "h100", 90, 8, 85_520_809_984)
    with pytest.raises(UserError) as e:
        comp.choose_gpu("b200", h100, None)
    assert "NVIDIA H100" in e.value.what
    assert comp.choose_gpu("h200", h100, None).sm == 90  # same compute capability


@pytest.mark.needs("no_tensorrt_llm")
def test_compile_without_tensorrt_llm_says_so(bundles):
    with pytest.raises(UserError) as e:
        comp.preflight(bundles["fp8"], "h100", require_runtime=True)
    assert "TensorRT-LLM is not installed" in e.value.what and "--check-only" in e.value.hint


def test_tensor_parallel_larger_than_visible_gpus_is_refused(fp8_copy):
    from eagle3_trt.pipeline.gpu_checks import DetectedGpu

    opts = fmt.open_bundle(fp8_copy).options.model_copy(update={"tensor_parallel_size": 4})
    bundle_write.update(fp8_copy, options=opts)
    one = DetectedGpu("NVIDIA H100 80GB HBM3", "h100", 90, 1, 85_520_809_984)
    with pytest.raises(UserError) as e:
        comp.preflight(fp8_copy, None, require_runtime=False, detected=one)
    assert "needs 4 GPUs and 1 are visible" in e.value.what


# --- manifest record ----------------------------------------------------------------------------


def test_record_compile_rewrites_manifest_atomically(fp8_copy):
    before = json.loads((fp8_copy / "manifest.json").read_text())
    rec = {
        "ok": True,
        "gpu": {"name": "NVIDIA H100 80GB HBM3", "sm": 90},
        "versions": {"tensorrt_llm": "1.2.1", "torch": "2.9.1"},
        "acceptance": {"alpha": 0.61, "acceptance_length": 2.9},
    }
    comp.record_compile(fp8_copy, rec)
    after = json.loads((fp8_copy / "manifest.json").read_text())
    assert {k: after["compile"][k] for k in rec} == rec and after["versions"]["tensorrt_llm"] == "1.2.1"
    for k, v in before.items():  # every other field kept as it was
        if k != "versions":
            assert after[k] == v, k
    assert fmt.verify(fp8_copy) == []  # a record changes no file the digests cover
    assert {k: v for k, v in after["versions"].items() if k != "tensorrt_llm"} == {k: v for k, v in before["versions"].items() if k != "tensorrt_llm"}
    assert [p.name for p in fp8_copy.iterdir() if p.name.startswith(".")] == []
    comp.record_compile(fp8_copy, {"ok": False, "error": "RuntimeError: CUDA out of memory"})  # a failed compile is recorded too
    assert json.loads((fp8_copy / "manifest.json").read_text())["compile"]["ok"] is False


def test_manifest_problems_are_user_errors(tmp_path):
    with pytest.raises(UserError) as e:
        comp.preflight(tmp_path, "h100", require_runtime=False)
    assert str(e.value.where).endswith("manifest.json") and "not found" in e.value.what
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(UserError) as e:
        comp.preflight(tmp_path, "h100", require_runtime=False)
    assert "not valid JSON" in e.value.what
    (tmp_path / "manifest.json").write_text('{"schema": 1}')
    with pytest.raises(UserError) as e:
        comp.preflight(tmp_path, "h100", require_runtime=False)
    assert "schema 1" in e.value.what and "--force" in e.value.hint


# --- acceptance arithmetic ----------------------------------------------------------------------


def test_acceptance_from_request_counters():
    k = 3
    reqs = [
        comp.RequestSpec(accepted=60, drafted=90, generated=91, forwards=31),  # 30 decode steps + prefill
        comp.RequestSpec(accepted=0, drafted=30, generated=11, forwards=None),
    ]  # forwards = 1 + 30/3 = 11
    a = comp.aggregate_acceptance(reqs, k)
    assert a["alpha"] == round(60 / 120, 4) and a["acceptance_length"] == round(102 / 42, 3)
    assert a["draft_tokens"] == 120 and a["accepted_draft_tokens"] == 60 and a["requests"] == 2
    assert comp.aggregate_acceptance([comp.RequestSpec(0, 0, 5, 5)], k)["alpha"] is None


def test_counters_are_read_from_request_output_shape():
    # The attribute path TensorRT-LLM documents: outputs[0].request_perf_metrics.speculative_decoding
    sd = SimpleNamespace(acceptance_rate=0.5, total_accepted_draft_tokens=12, total_draft_tokens=24)
    pm = SimpleNamespace(speculative_decoding=sd, first_iter=3, last_iter=10)
    out = SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(20)), request_perf_metrics=pm)])
    assert comp.spec_from_output(out) == comp.RequestSpec(12, 24, 20, 8, tuple(range(20)))  # the tokens kept for the agreement check
    out.outputs[0].request_perf_metrics = None
    with pytest.raises(UserError):
        comp.spec_from_output(out)


def test_alpha_prompts_are_available():
    prompts = comp.load_prompts(comp.SHIPPED_PROMPTS, 16)
    assert len(prompts) == 16 and all(isinstance(p, str) and p for p in prompts)


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_compile_check_only(bundles, capsys):
    assert cli_main(["compile", str(bundles["fp8"]), "--check-only", "--target-gpu", "h100"]) in (0, None)
    assert "checks passed" in capsys.readouterr().out
    assert cli_main(["compile", str(bundles["nvfp4"]), "--check-only", "--target-gpu", "h100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nvfp4" in err and "Blackwell" in err
    assert cli_main(["compile", str(bundles["nvfp4"]), "--check-only", "--json"]) in (0, None)
    assert json.loads(capsys.readouterr().out)["gpu"]["sm"] == 100


def test_cli_plan(capsys):
    assert cli_main(["plan", "llama3.3-70b", "--gpu", "h100", "--gpus", "4", "--quant", "fp8", "--json"]) in (0, None)
    plan = json.loads(capsys.readouterr().out)
    assert plan["tp"] == 2 and plan["instances"] == 2 and len(plan["steps"]) == 5
    assert cli_main(["plan", "llama3.3-70b", "--gpu", "b200", "--gpus", "2", "--quant", "nvfp4"]) in (0, None)
    out = capsys.readouterr().out
    assert "TP1 x PP1" in out and "steps of `make engine`" in out
    assert cli_main(["plan", "llama3.3-70b", "--gpu", "h100", "--gpus", "4", "--quant", "nvfp4"]) == 2
    assert "nvfp4 needs Blackwell" in capsys.readouterr().err


# --- the real thing (GPU machines with TensorRT-LLM) -------------------------------------------------


@pytest.mark.needs("cuda", "tensorrt_llm")
def test_compile_tiny_bundle_on_gpu(tmp_path):
    gpu, sm = detect_gpu()
    quant = "nvfp4" if sm >= 100 else "fp8"
    b = build_bundle(EngineRequest(preset=load_preset("tiny"), out=str(tmp_path / "b"), quant=quant, target_gpu=gpu)).bundle
    rec = comp.compile_bundle(b, prompts=4, max_tokens=32)
    assert rec["ok"] and rec["smoke"]["tokens"] > 0 and rec["acceptance"]["draft_tokens"] > 0
    assert json.loads((b / "manifest.json").read_text())["compile"]["gpu"]["sm"] == sm


def test_reference_and_served_acceptance_agreement_per_request_in_the_manifest(tmp_path):
    """`compile`'s comparison of the same prompts through the reference runtime and TensorRT-LLM, fed here
    with reference-runtime results on both sides (no TensorRT-LLM on this machine): the built FP8 bundle
    against itself (agreement, every request identical) and against its BF16 sources (the counters as each
    side measured them, the overall gap their sums give); recorded in the manifest's compile record."""
    from eagle3_trt.convert.embedded import heldout_prompts
    from eagle3_trt.core.engine import SamplingParams
    from eagle3_trt.runtime.loader import engine_from_bundle

    b = build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", out=str(tmp_path / "b"))).bundle
    k = fmt.open_bundle(b).k
    prompts = heldout_prompts(Path(__file__).resolve().parents[1] / "models" / "tiny")
    assert prompts is not None
    params = SamplingParams(max_tokens=24)
    built = [comp.spec_from_reference(r) for r in engine_from_bundle(b).generate(prompts[:6], params)]
    bf16 = [comp.spec_from_reference(r) for r in engine_from_bundle(b, reference=True).generate(prompts[:6], params)]

    same = comp.agreement(built, built, k)
    assert same["agree"] and same["alpha_difference"] == 0 and same["requests_with_same_tokens"] == same["requests_with_same_counts"] == 6

    diff = comp.agreement(built, bf16, k)
    assert [r["reference"]["accepted"] for r in diff["per_request"]] == [s.accepted for s in built]
    assert [r["served"]["drafted"] for r in diff["per_request"]] == [s.drafted for s in bf16]
    alpha = [round(sum(s.accepted for s in side) / sum(s.drafted for s in side), 4) for side in (built, bf16)]
    assert (diff["reference"]["alpha"], diff["served"]["alpha"]) == tuple(alpha) and 0.2 < alpha[0] <= 1.0
    assert diff["alpha_difference"] == round(alpha[1] - alpha[0], 4) and diff["agree"] == (abs(alpha[1] - alpha[0]) <= comp.AGREEMENT_ALPHA_TOLERANCE)
    assert diff["requests_with_same_tokens"] == sum(x.token_ids == y.token_ids for x, y in zip(built, bf16))

    comp.record_compile(b, {"ok": True, "agreement": diff})
    assert json.loads((b / "manifest.json").read_text())["compile"]["agreement"] == json.loads(json.dumps(diff))
    assert fmt.verify(b) == []
    with pytest.raises(UserError):
        comp.agreement(built, bf16[:2], k)
