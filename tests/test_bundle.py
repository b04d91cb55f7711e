"""The engine bundle: contents, options, manifest, cache hits, and nothing half-written on failure."""

import json
import subprocess
import sys

import pytest
import yaml
from safetensors.torch import load_file, save_file

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.bundle import open_bundle, verify
from eagle3_trt.pipeline.llm_options import LlmApiOptions
from eagle3_trt.pipeline.presets import load_preset


def build(preset: str = "tiny", **kw):
    return build_bundle(EngineRequest(preset=load_preset(preset), **kw))


def test_bundle_layout_options_and_manifest(fp8_bundle, tiny_pair_session):
    for p in (
        "target/config.json",
        "target/hf_quant_config.json",
        "target/tokenizer.json",
        "draft/config.json",
        "draft/model.safetensors",
        "tokenizer/tokenizer.json",
        "llm_api_options.yaml",
        "manifest.json",
        "validation.json",
    ):
        assert (fp8_bundle / p).is_file(), p
    opts = yaml.safe_load((fp8_bundle / "llm_api_options.yaml").read_text())
    parsed = LlmApiOptions.model_validate(opts)  # the schema round-trips, unknown keys would fail
    spec = opts["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and spec["max_draft_len"] == 3 and spec["speculative_model"] == "draft"
    assert "eagle3_layers_to_capture" not in spec  # default aux layers are left to TensorRT-LLM
    assert opts["kv_cache_config"]["dtype"] == "fp8" and opts["backend"] == "pytorch"
    assert parsed.cuda_graph_config.max_batch_size == max(parsed.cuda_graph_config.batch_sizes)
    m = json.loads((fp8_bundle / "manifest.json").read_text())
    assert m["schema"] == 2 and m["quant"] == {"target": "fp8", "draft": "bf16"}
    assert m["target_gpu"]["name"] == "h100"
    # K, aux layers and the KV dtype live in the options only; the Bundle derives them
    assert not {"max_draft_len", "aux_layer_ids", "aux_layers_are_default", "max_seq_len"} & set(m)
    assert not {"max_draft_len", "quant", "kv_cache_dtype"} & set(m["plan"])
    b = open_bundle(fp8_bundle)
    assert b.k == 3 and b.aux_layer_ids == (1, 3, 4) and b.kv_cache == "fp8" and b.formats["kv_cache"] == "fp8"
    assert verify(b) == []
    assert m["sources"]["target"]["files"]["model.safetensors"]["sha256"]
    assert m["calibration"]["sha256"] and m["calibration"]["tokens_sha256"] and m["calibration"]["prompts_used"] == 16
    for pkg in ("torch", "transformers", "nvidia-modelopt", "eagle3-trt"):
        assert m["versions"][pkg]
    assert {"validate_s", "quantize_target_s", "export_target_s", "total_s"} <= set(m["timings"])
    assert "target/model.safetensors" in m["outputs"] and "llm_api_options.yaml" in m["outputs"] and "launch/vllm.sh" in m["outputs"]
    assert "manifest.json" not in m["outputs"]
    # the exported draft is the normalized SafeAILab layout with its vocab map
    d = load_file(str(fp8_bundle / "draft" / "model.safetensors"))
    assert "midlayer.self_attn.q_proj.weight" in d and d["d2t"].shape == (256,)


def test_rebuild_is_a_cache_hit_and_force_rebuilds(tiny_pair_session, tmp_path):
    t, d = tiny_pair_session
    kw = dict(target=str(t), draft=str(d), target_gpu="h100", quant="fp8", out=str(tmp_path / "b"), calib_samples=2)
    first = build(**kw)
    assert not first.cache_hit
    again = build(**kw)
    assert again.cache_hit and again.manifest.fingerprint == first.manifest.fingerprint
    changed = build(**{**kw, "max_draft_len": 2})
    assert not changed.cache_hit
    assert yaml.safe_load((tmp_path / "b" / "llm_api_options.yaml").read_text())["speculative_config"]["max_draft_len"] == 2
    forced = build(**{**kw, "max_draft_len": 2, "force": True})
    assert not forced.cache_hit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temp or old dirs left behind


def test_failure_leaves_no_partial_bundle(tiny_pair, tmp_path):
    t = load_file(str(tiny_pair[1] / "model.safetensors"))
    t["d2t"][1] = t["d2t"][0] - 1
    t.pop("t2d")
    save_file(t, str(tiny_pair[1] / "model.safetensors"))
    out = tmp_path / "out" / "bundle"
    with pytest.raises(UserError, match="not injective"):
        build(target=str(tiny_pair[0]), draft=str(tiny_pair[1]), out=str(out))
    assert not out.exists()
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_failure_during_quantization_removes_staging_dir(tiny_pair, tmp_path):
    (tmp_path / "calib.jsonl").write_text('{"nope": 1}\n')
    out = tmp_path / "out" / "bundle"
    with pytest.raises(UserError, match="calib.jsonl:1"):
        build(target=str(tiny_pair[0]), draft=str(tiny_pair[1]), out=str(out), calib_file=str(tmp_path / "calib.jsonl"))
    # the calibration file is checked before the target is loaded, so nothing was staged at all;
    # an interrupt in the middle of calibration: tests/test_validation_holes.py
    assert not out.exists() and list((tmp_path / "out").glob("*")) == list((tmp_path / "out").glob(".*")) == []


def test_nvfp4_for_hopper_is_refused_before_any_work(tmp_path):
    with pytest.raises(UserError) as e:
        build(quant="nvfp4", target_gpu="h100", out=str(tmp_path / "b"))
    assert "nvfp4 needs Blackwell" in e.value.line() and "quant fp8" in e.value.line()
    assert not (tmp_path / "b").exists()


def test_explicit_aux_layers_reach_the_options(tiny_pair, tmp_path):
    cfg = json.loads((tiny_pair[1] / "config.json").read_text())
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 2, 6]}
    (tiny_pair[1] / "config.json").write_text(json.dumps(cfg))
    res = build(target=str(tiny_pair[0]), draft=str(tiny_pair[1]), out=str(tmp_path / "b"), calib_samples=2, quant="bf16", kv_cache="auto")
    opts = yaml.safe_load((res.bundle / "llm_api_options.yaml").read_text())
    assert opts["speculative_config"]["eagle3_layers_to_capture"] == [0, 2, 6]
    assert res.manifest.quant.target == "bf16" and res.opened.aux_layer_ids == (0, 2, 6)
    assert json.loads((res.bundle / "draft" / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 6]


def test_dry_run_for_the_70b_preset_writes_options_and_manifest_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    res = build("llama3.3-70b", dry_run=True, target_gpu="h100", out=str(tmp_path / "b"))
    opts = yaml.safe_load((res.bundle / "llm_api_options.yaml").read_text())
    assert opts["speculative_config"]["max_draft_len"] == 4 and "eagle3_layers_to_capture" not in opts["speculative_config"]
    assert res.manifest.dry_run and res.opened.aux_layer_ids == (1, 39, 76) and res.opened.aux_layers_are_default
    assert not list(res.bundle.rglob("*.safetensors"))


def test_cli_one_line_errors_and_exit_codes(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], capture_output=True, text=True, timeout=120)

    r = run("engine", "--model", "nope", "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and r.stderr.strip().startswith("error: MODEL: unknown preset 'nope'")
    assert len(r.stderr.strip().splitlines()) == 1 and "tiny" in r.stderr
    r = run("engine", "--model", "tiny", "--quant", "nvfp4", "--target-gpu", "h100", "-o", str(tmp_path / "x"))
    assert r.returncode == 2 and "Blackwell" in r.stderr and not (tmp_path / "x").exists()
    r = run("--help")
    assert r.returncode == 0 and "presets -> checkpoints" in r.stdout


@pytest.mark.needs("make_venv")
def test_make_engine_dry_run_for_70b(tmp_path, monkeypatch):
    """The offline CI build: `make engine MODEL=llama3.3-70b DRY_RUN=1` from config files only."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    # VENV= this venv with its install stamp taken as done (-o): make never reinstalls into the running venv
    # (a clone tested with another checkout's venv would otherwise repoint its editable install at the clone)
    venv = Path(sys.executable).parent.parent
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "no-hf-cache")}
    r = subprocess.run(
        ["make", "-s", "engine", "MODEL=llama3.3-70b", "DRY_RUN=1", f"OUT={tmp_path / 'b'}", f"VENV={venv}", "-o", f"{venv}/.eagle3-trt-installed"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "dry run" in r.stderr and (tmp_path / "b" / "llm_api_options.yaml").is_file()
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["preset"] == "llama3.3-70b" and m["quant"]["target"] == "fp8" and m["dry_run"]


@pytest.mark.needs("make_venv")
@pytest.mark.parametrize("model, guess", [("nope", None), ("llama-70b", "llama3.3-70b")])
def test_make_engine_with_an_unknown_model_is_one_line(tmp_path, model, guess):
    """`make engine MODEL=<typo>`: the CLI's one line (the registry, the closest name when there is
    one), then only make's own one-line trailer; nothing written, no traceback."""
    import os
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    venv = Path(sys.executable).parent.parent
    r = subprocess.run(
        ["make", "-s", "engine", f"MODEL={model}", f"OUT={tmp_path / 'b'}", f"VENV={venv}", "-o", f"{venv}/.eagle3-trt-installed"],
        cwd=root,
        env={**os.environ, "MAKEFLAGS": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    # (a Makefile newer than the venv's stamp reruns setup first: its lines are not this test's business)
    *_, line, trailer = r.stderr.strip().splitlines()
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error")] == [line], r.stderr
    assert line.startswith(f"error: MODEL: unknown preset '{model}'") and "available presets: gpt-oss-120b" in line and "tiny" in line, r.stderr
    assert (f"did you mean '{guess}'?" in line) if guess else ("did you mean" not in line), line
    # make[1] when the suite itself runs under make test
    assert re.fullmatch(r"make(\[\d+\])?: \*\*\* \[\S*Makefile:\d+: engine\] Error 2", trailer), r.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["engine", "--model", "llama-70b"], "did you mean 'llama3.3-70b'?"),
        (["engine", "--target", "/nonexistent/t", "--draft", "/nonexistent/d"], "--target /nonexistent/t: directory does not exist"),
        (["plan", "llama-70b"], "did you mean 'llama3.3-70b'?"),
    ],
)
def test_a_mistyped_model_or_path_answers_before_torch_is_imported(argv, says):
    """The refusal comes before the builder's imports (torch, transformers, ModelOpt: seconds)."""
    code = f"import sys; from eagle3_trt.cli import main; rc = main({argv!r}); print('torch' in sys.modules); sys.exit(rc)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout.strip() == "False", "torch was imported before the refusal"


def test_embedded_pair_bundle_measures_its_acceptance(tmp_path):
    """What `make engine` does: the shipped pair, built, then measured on its held-out prompts."""
    res = build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", out=str(tmp_path / "b")))
    acc = json.loads((res.bundle / "manifest.json").read_text())["acceptance"]
    assert acc["prompts"] == 8 and acc["max_draft_len"] == 3 and acc["target_forwards"] > 0
    assert 0.2 < acc["alpha"] <= 1.0 and 1.0 < acc["acceptance_length"] <= 4.0
    assert acc["measured_on"].startswith("heldout_prompts.json")


def _heldout_file(path, n: int = 8):
    """The embedded pair's first ``n`` held-out prompts, as a user's held-out file (token ids, measured as stored)."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "models" / "tiny" / "heldout_prompts.json"
    held = json.loads(src.read_text())
    path.write_text(json.dumps({"about": "the tiny pair's first held-out prompts", "prompts": held["prompts"][:n]}))
    return path


@pytest.mark.needs("make_venv")
def test_make_engine_for_a_real_target_gates_the_heldout_prompts_given(tmp_path):
    """`make engine TARGET=dir DRAFT=dir HELDOUT=file`: the pair given as directories (no embedded
    prompts of its own) is measured on the file, the verdict printed and recorded; the figure is the
    one the embedded pair's own check gives on the same prompts (one implementation of the measurement)."""
    import os
    import re
    from pathlib import Path

    from eagle3_trt.pipeline.build_checkpoints import measure_embedded_acceptance

    root = Path(__file__).resolve().parents[1]
    venv = Path(sys.executable).parent.parent
    held = _heldout_file(tmp_path / "held.json")
    out = tmp_path / "b"
    r = subprocess.run(
        ["make", "-s", "engine", "MODEL=tiny", f"TARGET={root / 'models/tiny/target'}", f"DRAFT={root / 'models/tiny/draft'}", "GPU=h100"]
        + [f"HELDOUT={held}", f"OUT={out}", f"VENV={venv}", "-o", f"{venv}/.eagle3-trt-installed"],
        cwd=root,
        env={**os.environ, "MAKEFLAGS": ""},
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-3000:]
    acc = json.loads((out / "manifest.json").read_text())["acceptance"]
    assert acc["prompts"] == 8 and acc["prompts_file"] == str(held.resolve()) and str(held) in acc["measured_on"]
    assert re.search(r"acceptance \(K=3, 8 prompts; .*\): alpha \d\.\d\d", text), text
    verdict = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("gate: ")]
    assert len(verdict) == 1 and re.match(r"gate: (PASS|FAIL): alpha \d\.\d{3}", verdict[0]), text
    assert f"{acc['alpha']:.3f}" in verdict[0] and ("PASS" in verdict[0]) == (acc["alpha"] >= 0.55)
    b = open_bundle(out)
    same = measure_embedded_acceptance(out, root / "models" / "tiny", b.k, tuple(b.aux_layer_ids))
    assert same is not None and (same.alpha, same.generated_tokens, same.target_forwards) == (acc["alpha"], acc["generated_tokens"], acc["target_forwards"])


def test_a_real_target_without_heldout_prompts_says_no_gate_was_run(tiny_pair_session, tmp_path):
    t, d = tiny_pair_session
    res = build(target=str(t), draft=str(d), target_gpu="h100", out=str(tmp_path / "b"), skip_behaviour_checks=True)
    assert res.manifest.acceptance is None
    assert res.gate_note is not None and res.gate_note.startswith("gate: not run: no held-out prompts") and "--heldout-prompts FILE" in res.gate_note
    again = build(target=str(t), draft=str(d), target_gpu="h100", out=str(tmp_path / "b"), skip_behaviour_checks=True)
    assert again.cache_hit and again.gate_note == res.gate_note  # a cache hit says it too


@pytest.mark.parametrize("content", [None, "", "\n\n"])
def test_heldout_prompts_missing_or_empty_is_one_line_exit_2(tmp_path, content):
    f = tmp_path / "held.jsonl"
    if content is not None:
        f.write_text(content)
    r = subprocess.run(
        [sys.executable, "-m", "eagle3_trt.cli", "engine", "--model", "tiny", "--heldout-prompts", str(f), "-o", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: {f}: ") and ("not found" if content is None else "no prompts") in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b").exists()


def test_heldout_prompts_with_a_dry_run_is_refused(tmp_path):
    with pytest.raises(UserError) as e:
        build(target_gpu="h100", dry_run=True, heldout_prompts=str(_heldout_file(tmp_path / "held.json")), out=str(tmp_path / "b"))
    assert e.value.where == "--heldout-prompts" and not (tmp_path / "b").exists()


def test_heldout_prompts_for_a_target_that_fits_no_device_name_the_gate_tp_command(tmp_path):
    """A 70B target (its config files, as the registry ships them): measuring it on this host would take
    262.8 GiB in float32, so the build says so in one line with the `gate --tp N` command to run instead,
    at the TP `plan --measure` picks."""
    import shutil
    from pathlib import Path
    from types import SimpleNamespace

    from eagle3_trt.pipeline.builder import _gate_note
    from eagle3_trt.pipeline.gpus import get_gpu

    cfgs = Path(__file__).resolve().parents[1] / "build" / "model_configs" / "llama3.3-70b"
    staged = tmp_path / "staged"
    for role in ("target", "draft"):
        (staged / role).mkdir(parents=True)
        shutil.copy(cfgs / role / "config.json", staged / role / "config.json")
    req = EngineRequest(preset=load_preset("llama3.3-70b"), heldout_prompts="held.jsonl")
    st = SimpleNamespace(dest=tmp_path / "b", gpu=get_gpu("h100"), k=4)
    note = _gate_note(req, st, SimpleNamespace(num_gpus=8, tp=8), staged)
    assert note is not None and note.startswith("gate: not run in the build: measuring the target on one device needs 26")
    # the TP `plan llama3.3-70b --gpu h100 --gpus 8 --measure` picks (docs/gpu-runbook.md step 4: TP=4)
    assert note.endswith(f"eagle3-trt gate {tmp_path / 'b'} --prompts held.jsonl --tp 4"), note
