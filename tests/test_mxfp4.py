"""gpt-oss as openai ships it: MXFP4 experts read, validated and measured, on the embedded tiny-gpt-oss pair.

The pair (models/tiny-gpt-oss, made by ``make_tiny_pair --family gpt-oss``) is a trained GptOssForCausalLM
whose experts are stored in the MXFP4 layout of openai/gpt-oss-{20b,120b} (``*_blocks``/``*_scales``,
``quantization_config.quant_method: mxfp4``). Checked against code this project did not write: transformers'
own MXFP4 dequantizer and its CPU loading of the checkpoint.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eagle3_trt.convert import mxfp4
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.load import load_target
from eagle3_trt.convert.target import read_target
from eagle3_trt.convert.validate import validate_pair
from eagle3_trt.errors import UserError
from eagle3_trt.measure.alpha_run import run_alpha
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.presets import load_preset

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "models" / "tiny-gpt-oss"


def test_dequantize_equals_transformers_on_arbitrary_codes():
    """Random codes and exponents (not only what our quantizer writes), against transformers'
    ``convert_moe_packed_tensors`` (integrations/mxfp4.py, the loader openai's checkpoints go through)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 64, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 135, (3, 64, 4), generator=g, dtype=torch.uint8)
    ours = mxfp4.dequantize(blocks, scales, torch.float32)
    assert ours.shape == (3, 128, 64)  # [E, in, out]: GptOssExperts computes x @ W
    assert torch.equal(ours, convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    # every MXFP4 value is a BF16 value: dequantizing to BF16 loses nothing
    assert torch.equal(mxfp4.dequantize(blocks, scales, torch.bfloat16).float(), ours)


def test_quantize_round_trips_representable_weights_and_bounds_the_rest():
    g = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (2, 32, 2, 16), generator=g, dtype=torch.uint8)
    blocks[..., 0] = 0x07  # a 6.0 in every block: the block's scale is the one our quantizer picks
    scales = torch.randint(115, 130, (2, 32, 2), generator=g, dtype=torch.uint8)
    w = mxfp4.dequantize(blocks, scales)
    assert torch.equal(mxfp4.dequantize(*mxfp4.quantize(w)), w)
    x = torch.randn(2, 64, 48, generator=g)
    err = (mxfp4.dequantize(*mxfp4.quantize(x)) - x).abs()
    amax = x.transpose(-1, -2).reshape(2, 48, 2, 32).abs().amax(-1).repeat_interleave(32, -1).transpose(-1, -2)
    # the scale is the smallest power of two putting the block max at <= 6, so scale <= amax / 3, and the
    # error is at most half the largest E2M1 step (2) times the scale
    assert (err <= amax / 3 + 1e-7).all()


def test_the_embedded_pair_ships_the_openai_layout():
    cfg = json.loads((PAIR / "target" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "mxfp4" and cfg["model_type"] == "gpt_oss"
    with safe_open(str(PAIR / "target" / "model.safetensors"), "pt") as f:
        dt = {k: str(f.get_slice(k).get_dtype()) for k in f.keys()}
        shape = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    H, I, E = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    assert shape["model.layers.0.mlp.experts.gate_up_proj_blocks"] == (E, 2 * I, H // 32, 16)
    assert shape["model.layers.0.mlp.experts.down_proj_scales"] == (E, H, I // 32)
    assert dt["model.layers.0.mlp.experts.gate_up_proj_blocks"] == dt["model.layers.0.mlp.experts.gate_up_proj_scales"] == "U8"
    assert dt["model.layers.0.self_attn.sinks"] == dt["model.layers.0.mlp.router.weight"] == "BF16"
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in dt)


def test_runtime_equals_transformers_loading_the_mxfp4_checkpoint():
    """transformers' from_pretrained dequantizes MXFP4 on a CPU by its own code: every tensor the reference
    runtime loads equals it, and the whole forward (MoE routing, sinks, the 32-token windows over a longer
    prompt, the runtime's masks) computes the same logits. The rotary tables are swapped for transformers'
    for that comparison: the runtime's are TensorRT-LLM's yarn tables, which differ from transformers' on
    purpose (tests/test_rope_types.py)."""
    cfg = json.loads((PAIR / "target" / "config.json").read_text())
    ref = transformers.AutoModelForCausalLM.from_pretrained(PAIR / "target", dtype=torch.float32).eval()
    ref.float()  # transformers keeps the dequantized experts in BF16 (exact: every MXFP4 value is a BF16 value)
    tm = load_target(PAIR / "target", dtype=torch.float32, aux_layer_ids=(1, 3, 4))
    want_sd, got_sd = ref.state_dict(), tm.hf.state_dict()
    assert want_sd.keys() == got_sd.keys()
    assert [k for k in want_sd if not torch.equal(want_sd[k], got_sd[k])] == []
    held = json.loads((PAIR / "heldout_prompts.json").read_text())["prompts"]
    ids = torch.tensor([held[0][:40], held[1][:40]])
    assert ids.shape[1] > cfg["sliding_window"]
    tm.hf.model.rotary_emb = ref.model.rotary_emb
    with torch.no_grad():
        want = ref(ids).logits
    _, h = tm.teacher_forced(ids)
    assert (tm.hf.lm_head(h) - want).abs().max() < 1e-4


# ---- validation: the family's tensor table, MXFP4 layout included ------------------------------------
@pytest.fixture()
def pair(tmp_path) -> tuple[Path, Path]:
    shutil.copytree(PAIR / "target", tmp_path / "target")
    shutil.copytree(PAIR / "draft", tmp_path / "draft")
    return tmp_path / "target", tmp_path / "draft"


def _rewrite(target: Path, fn) -> None:
    sd = load_file(str(target / "model.safetensors"))
    fn(sd)
    save_file(sd, str(target / "model.safetensors"), metadata={"format": "pt"})


def _densify(target: Path) -> None:
    """The experts as transformers holds them in BF16 (the MXFP4 values exactly)."""
    _rewrite(target, lambda sd: sd.update(mxfp4.dense_experts({k: sd.pop(k) for k in list(sd)}, torch.bfloat16)))


def test_validation_checks_every_layer_of_the_shipped_format(pair):
    t, d = pair
    rep = validate_pair(read_target(t), load_draft(d), 512)
    detail = {c["check"]: c["detail"] for c in rep.checks}
    assert "4 experts in mxfp4" in detail["target_weights"] and "self_attn.sinks" in detail["target_weights"]
    assert detail["target_format"].startswith("mxfp4 as shipped")
    with pytest.raises(
        UserError, match=r"quantization_config\.quant_method: fp8 on a target that ships MXFP4 weights .*re-quantizing .*hint: use --quant native"
    ):
        validate_pair(read_target(t), load_draft(d), 512, quant="fp8")


@pytest.mark.parametrize(
    "damage, pattern",
    [
        (
            lambda sd: sd.pop("model.layers.7.mlp.experts.down_proj_scales"),
            r"model\.layers\.7\.mlp\.experts\.down_proj_scales missing: a gpt-oss decoder layer has it \(mxfp4 checkpoints ship it\)",
        ),
        (lambda sd: sd.pop("model.layers.3.self_attn.sinks"), r"model\.layers\.3\.self_attn\.sinks missing"),
        (
            lambda sd: sd.update({"model.layers.2.mlp.experts.gate_up_proj_scales": sd["model.layers.2.mlp.experts.gate_up_proj_scales"].to(torch.int16)}),
            r"gate_up_proj_scales: dtype int16, mxfp4 ships uint8",
        ),
        (
            lambda sd: sd.update({"model.layers.1.mlp.router.weight": sd["model.layers.1.mlp.router.weight"][:3]}),
            r"model\.layers\.1\.mlp\.router\.weight: shape \(3, 128\), config\.json implies \(4, 128\)",
        ),
    ],
)
def test_a_damaged_mxfp4_checkpoint_is_refused_in_one_line(pair, damage, pattern):
    t, d = pair
    _rewrite(t, damage)
    with pytest.raises(UserError, match=pattern):
        validate_pair(read_target(t), load_draft(d), 512)


def test_a_dense_gpt_oss_checkpoint_validates_against_the_bf16_table(pair):
    """The same model as transformers writes it unquantized (dense experts, no quantization_config)."""
    t, d = pair
    _densify(t)
    cfg = json.loads((t / "config.json").read_text())
    del cfg["quantization_config"]
    (t / "config.json").write_text(json.dumps(cfg))
    rep = validate_pair(read_target(t), load_draft(d), 512)
    assert "mlp.experts.gate_up_proj," in {c["check"]: c["detail"] for c in rep.checks}["target_weights"]


# ---- engine (--quant native) -> alpha on the embedded pair ---------------------------------------------
@pytest.fixture(scope="module")
def native_bundle(tmp_path_factory) -> Path:
    return build_bundle(EngineRequest(preset=load_preset("tiny-gpt-oss"), target_gpu="b200", out=str(tmp_path_factory.mktemp("go") / "native"))).bundle


def test_native_bundle_keeps_the_target_as_shipped(native_bundle):
    src, out = PAIR / "target" / "model.safetensors", native_bundle / "target" / "model.safetensors"
    a, b = load_file(str(src)), load_file(str(out))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    man = json.loads((native_bundle / "manifest.json").read_text())
    assert man["quant"] == {"target": "native", "draft": "bf16", "target_native": "mxfp4"}
    opts = yaml.safe_load((native_bundle / "llm_api_options.yaml").read_text())
    assert opts["moe_config"] == {"backend": "TRTLLM"} and opts["kv_cache_config"]["dtype"] == "auto"


def test_alpha_on_the_native_bundle_says_how_mxfp4_was_measured(native_bundle, tmp_path, alpha_on_heldout):
    rep = alpha_on_heldout(native_bundle, PAIR, tmp_path)
    o = rep["pairs"]["bundle"]["overall"]
    assert o["requests"] == 3 and o["acceptance_length"] > 1.5, o
    assert "dequantizes them exactly" in rep["numerics_note"] and "reference" not in rep["pairs"]
    assert "kept as shipped (mxfp4)" in rep["reference_note"]
    # the cost model prices the MoE target in MXFP4 with the experts its tokens route to
    assert rep["recommendation"]["evidence"]["target"]["format"] == "mxfp4"
    assert rep["recommendation"]["evidence"]["target"]["moe"]["experts"] == 4
    # and there is no BF16 source to compare with: --bf16 is refused in one line
    with pytest.raises(UserError, match=r"--bf16: the bundle's target is kept as shipped \(mxfp4\)"):
        run_alpha(native_bundle, tmp_path / "p.jsonl", bf16=True)


def test_fp8_kv_on_a_native_build_is_refused(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "eagle3_trt.cli", "engine", "--model", "tiny-gpt-oss", "--kv-cache", "fp8", "-o", str(tmp_path / "b")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: --kv-cache: fp8 with --quant native")
    assert not (tmp_path / "b").exists()


def test_a_sharded_mxfp4_target_builds_as_shipped_without_asking(tmp_path):
    """As openai ships gpt-oss: shards with an index, a block tensor and its scales in different files; a plain
    `engine --target --draft` (no --quant) keeps the target as shipped instead of refusing the preset's fp8."""
    sd = load_file(str(PAIR / "target" / "model.safetensors"))
    t = tmp_path / "target"
    shutil.copytree(PAIR / "target", t, ignore=shutil.ignore_patterns("*.safetensors"))
    shards = {
        "model-00000-of-00002.safetensors": {k: v for k, v in sd.items() if not k.endswith("_scales")},
        "model-00001-of-00002.safetensors": {k: v for k, v in sd.items() if k.endswith("_scales")},
    }
    for name, part in shards.items():
        save_file(part, str(t / name), metadata={"format": "pt"})
    (t / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}))
    r = subprocess.run(
        [sys.executable, "-m", "eagle3_trt.cli", "engine", "--target", str(t), "--draft", str(PAIR / "draft"), "-o", str(tmp_path / "b")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert man["quant"]["target"] == "native" and man["quant"]["target_native"] == "mxfp4"
    assert not man["calibration"].get("prompts_used")  # nothing was calibrated
    built = {k: v for f in (tmp_path / "b" / "target").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    assert built.keys() == sd.keys() and all(torch.equal(built[k], sd[k]) for k in sd)


# ---- the config and the tensors must tell the same story ------------------------------------------------
def _set_quant_method(t: Path, method) -> None:
    cfg = json.loads((t / "config.json").read_text())
    if method is None:
        cfg.pop("quantization_config")
    else:
        cfg["quantization_config"]["quant_method"] = method
    (t / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "method, pattern",
    [
        (
            None,
            r"config\.json:quantization_config: the weights ship the experts in mxfp4 \(blocks/scales\) but config\.json has no "
            r"quantization_config",
        ),
        ("MXFP4", r"quantization_config\.quant_method: the weights ship the experts in mxfp4 .* has quant_method 'MXFP4'"),
        ("gptq", r"quantization_config\.quant_method: the weights ship the experts in mxfp4 .* has quant_method 'gptq'"),
    ],
)
def test_mxfp4_tensors_under_another_config_are_refused_by_the_config_field(pair, method, pattern):
    t, d = pair
    _set_quant_method(t, method)
    with pytest.raises(UserError, match=pattern):
        validate_pair(read_target(t), load_draft(d), 512)


def test_an_mxfp4_config_over_dense_experts_is_refused(pair):
    t, d = pair
    _densify(t)
    with pytest.raises(UserError, match=r"quantization_config\.quant_method: 'mxfp4', but the weights hold dense experts"):
        validate_pair(read_target(t), load_draft(d), 512)


def test_a_hidden_size_mxfp4_cannot_hold_is_refused(tmp_path):
    """hidden 80 is not a multiple of 32: blocks can cover 64 columns (floor) or 96 (padded), never 80."""
    cfg = transformers.GptOssConfig(
        hidden_size=80,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=40,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=1024,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 3,
    )
    t = tmp_path / "target"
    transformers.GptOssForCausalLM(cfg).save_pretrained(t)
    sd = load_file(str(t / "model.safetensors"))
    for k in [k for k in sd if k.endswith("experts.gate_up_proj")]:
        sd[k + "_blocks"], sd[k + "_scales"] = mxfp4.quantize(sd.pop(k)[:, :64, :])  # what a floor packer writes
    for k in [k for k in sd if k.endswith("experts.down_proj")]:
        sd[k + "_blocks"], sd[k + "_scales"] = mxfp4.quantize(sd.pop(k))
    save_file(sd, str(t / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((t / "config.json").read_text())
    raw["quantization_config"] = dict(mxfp4.QUANTIZATION_CONFIG)
    (t / "config.json").write_text(json.dumps(raw))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(PAIR / "target" / f, t / f)
    with pytest.raises(UserError, match=r"config\.json:hidden_size: 80 is not a multiple of the mxfp4 block \(32\)"):
        validate_pair(read_target(t), load_draft(PAIR / "draft"), 512)


def test_a_bf16_gpt_oss_target_builds_in_bf16_and_modelopt_formats_are_refused(tmp_path):
    """The same model dequantized to BF16 (as transformers would save it): built BF16 when no --quant is given;
    fp8/nvfp4 refused (the runtime cannot measure ModelOpt's fused-expert export); native refused (nothing shipped)."""
    t = tmp_path / "target"
    shutil.copytree(PAIR / "target", t)
    _rewrite(
        t,
        lambda sd: sd.update(
            {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in mxfp4.dense_experts({k: sd.pop(k) for k in list(sd)}).items()}
        ),
    )
    _set_quant_method(t, None)
    req = dict(preset=load_preset("tiny"), target=str(t), draft=str(PAIR / "draft"), target_gpu="h100")
    res = build_bundle(EngineRequest(**req, out=str(tmp_path / "b")))
    assert res.manifest.quant.target == "bf16"
    for quant, pattern in (
        ("fp8", r"fp8 on a gpt-oss target: ModelOpt's fp8/nvfp4 export .*\(hint: use --quant bf16"),
        ("native", r"native keeps an already-quantized target as shipped, but this target is not quantized"),
    ):
        with pytest.raises(UserError, match=pattern):
            build_bundle(EngineRequest(**req, quant=quant, out=str(tmp_path / quant)))
        assert not (tmp_path / quant).exists()


def test_a_nan_exponent_is_refused_when_the_runtime_loads_the_target(pair):
    """E8M0 code 255 is NaN: the header-only validation cannot see it; loading the target (alpha, serving,
    train-draft) refuses it in one line instead of measuring infinities."""
    t, _ = pair

    def poison(sd):
        s = sd["model.layers.4.mlp.experts.down_proj_scales"].clone()
        s[0, 0, 0] = 255
        sd["model.layers.4.mlp.experts.down_proj_scales"] = s

    _rewrite(t, poison)
    with pytest.raises(UserError, match=r"down_proj_scales: 1 blocks have the E8M0 NaN exponent \(255\)"):
        load_target(t)
