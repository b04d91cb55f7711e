"""Exported FP8/NVFP4 tensors: dtype, shape, scale layout, and error against the originals."""

import json

import pytest
import torch
from safetensors.torch import load_file

from eagle3_trt.convert.dequantize import dequant_fp8, dequant_nvfp4, load_checkpoint_dequantized
from eagle3_trt.core.nvfp4 import nvfp4_fake_quant

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def originals(pair):
    return load_file(str(pair[0] / "model.safetensors"))


def test_fp8_target_layout_and_error_bound(fp8_bundle, tiny_pair_session):
    q = load_file(str(fp8_bundle / "target" / "model.safetensors"))
    ref = originals(tiny_pair_session)
    n = 0
    for name, w in ref.items():
        if not any(f".{p}." in name for p in LINEARS):
            continue
        mod = name[: -len(".weight")]
        assert q[name].dtype == torch.float8_e4m3fn and q[name].shape == w.shape
        assert q[f"{mod}.weight_scale"].numel() == 1 and q[f"{mod}.input_scale"].numel() == 1
        scale = q[f"{mod}.weight_scale"].float()
        # per-tensor scale = amax / 448 (e4m3 max)
        assert scale.item() == pytest.approx(w.float().abs().max().item() / 448, rel=1e-2)
        deq = dequant_fp8(q[name], q[f"{mod}.weight_scale"])
        err = (deq - w.float()).abs()
        # e4m3: 3 mantissa bits -> relative rounding error <= 2^-4 for normals; subnormal step = scale * 2^-9
        bound = torch.maximum(w.float().abs() * 2**-4, scale * 2**-9) * 1.01 + 1e-12
        assert bool((err <= bound).all()), f"{name}: max err {err.max()}"
        n += 1
    assert n == 8 * 7
    for keep in ("lm_head.weight", "model.embed_tokens.weight"):
        assert q[keep].dtype == torch.bfloat16 and torch.equal(q[keep], ref[keep])
    assert "model.layers.0.self_attn.k_proj.k_scale" in q and "model.layers.0.self_attn.v_proj.v_scale" in q


def test_fp8_quant_config_files(fp8_bundle):
    hq = json.loads((fp8_bundle / "target" / "hf_quant_config.json").read_text())
    assert hq["producer"]["name"] == "modelopt"
    assert hq["quantization"]["quant_algo"] == "FP8" and hq["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert "lm_head" in hq["quantization"]["exclude_modules"]
    cfg = json.loads((fp8_bundle / "target" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "modelopt"
    # both transformers generations read rope from the exported config
    assert cfg["rope_theta"] == 10000.0 and cfg["torch_dtype"] == "bfloat16"


def test_nvfp4_target_layout_and_error_bound(nvfp4_bundle, tiny_pair_session):
    q = load_file(str(nvfp4_bundle / "target" / "model.safetensors"))
    ref = originals(tiny_pair_session)
    n = mismatched = total = 0
    for name, w in ref.items():
        if not any(f".{p}." in name for p in LINEARS):
            continue
        mod = name[: -len(".weight")]
        out_f, in_f = w.shape
        assert q[name].dtype == torch.uint8 and q[name].shape == (out_f, in_f // 2)
        ws, ws2 = q[f"{mod}.weight_scale"], q[f"{mod}.weight_scale_2"]
        assert ws.dtype == torch.float8_e4m3fn and ws.shape == (out_f, in_f // 16)
        assert ws2.dtype == torch.float32 and ws2.numel() == 1
        # global scale = amax / (6 * 448), amax taken over the layers TensorRT-LLM fuses (q/k/v, gate/up)
        assert ws2.item() >= w.float().abs().max().item() / (6 * 448) * 0.99
        deq = dequant_nvfp4(q[name], ws, ws2)
        # block-wise bound: half the widest E2M1 gap (1.0) times the block scale, plus block-scale rounding
        blocks = w.float().reshape(-1, 16)
        bscale = (ws.float() * ws2.float()).reshape(-1, 1)
        err = (deq.reshape(-1, 16) - blocks).abs()
        bound = bscale * 1.0 + blocks.abs().amax(-1, keepdim=True) * 2**-3 + 1e-12
        assert bool((err <= bound).all()), f"{name}: max err {err.max()}"
        # ModelOpt's export and our CPU fake-quant fallback implement the same rounding; they may
        # differ only on values within float error of an E2M1 midpoint (one grid step apart).
        fq = nvfp4_fake_quant(w.float(), 16, ws2.float() * 6 * 448)
        diff = (fq - deq).abs().reshape(-1, 16)
        mismatched += int((diff > 1e-7).sum())
        total += diff.numel()
        assert bool((diff <= 2 * bscale + 1e-7).all())
        n += 1
    assert n == 8 * 7
    assert mismatched / total < 0.005, f"{mismatched}/{total} elements round differently"


def test_nvfp4_quantized_draft(nvfp4_bundle):
    q = load_file(str(nvfp4_bundle / "draft" / "model.safetensors"))
    assert q["midlayer.self_attn.q_proj.weight"].dtype == torch.uint8
    assert q["fc.weight"].dtype == torch.uint8 and q["fc.weight"].shape == (64, 192 // 2)
    assert q["lm_head.weight"].dtype == torch.bfloat16
    assert q["d2t"].dtype == torch.int64 and q["d2t"].shape == (256,)
    # q/k/v are fused into one GEMM in TensorRT-LLM: they must share one input scale
    s = [q[f"midlayer.self_attn.{p}_proj.input_scale"].item() for p in "qkv"]
    assert s[0] == s[1] == s[2]
    cfg = json.loads((nvfp4_bundle / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 256
    assert cfg["quantization_config"]["quant_algo"] == "NVFP4"
    assert json.loads((nvfp4_bundle / "draft" / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"


def test_dequantized_checkpoint_loads_into_transformers(fp8_bundle, tiny_pair_session):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    cfg, sd, info = load_checkpoint_dequantized(fp8_bundle / "target", torch.float32)
    assert info["quant_algo"] == "FP8" and info["input_scales"]
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures",)}))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_pair_session[0]), dtype=torch.float32)
    ids = torch.tensor([[0, 5, 17, 99, 200, 311]])
    with torch.no_grad():
        a, b = model.eval()(ids).logits, ref.eval()(ids).logits
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.99
