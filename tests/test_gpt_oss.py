"""gpt-oss (MoE, MXFP4 experts, alternating sliding-window layers, attention sinks) as one more entry of
the family table: config-only presets, MoE planning checked by hand, ``--quant native`` and its refusals.

Hand figures use the published configs (build/model_configs/gpt-oss-*/target/config.json): hidden 2880,
64 query / 8 KV heads of 64, 128 (120b) or 32 (20b) experts of intermediate 2880, 4 per token, vocab 201088,
sliding window 128 on the even layers, MXFP4 experts (0.5 byte + one e8m0 scale per 32 weights).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import GPT_OSS, family_of
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.model_size import count_target, parse_shape, read_config
from eagle3_trt.pipeline.plan_presets import plan_for_preset
from eagle3_trt.pipeline.presets import load_preset

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "build" / "model_configs"
H, HEADS, KV, HD, I, V = 2880, 64, 8, 64, 2880, 201088
MXFP4 = 0.5 + 1 / 32


def _cfg(name: str) -> dict:
    return read_config(CONFIGS / name / "target" / "config.json")


def test_family_entry_and_aux_default():
    assert family_of("gpt_oss") is GPT_OSS and GPT_OSS.hf_class == "GptOssForCausalLM"
    # TensorRT-LLM's generic {1, L//2-1, L-4}: gpt-oss captures after the MoE block as Llama does
    assert GPT_OSS.default_aux_layers(36) == (1, 17, 32) and GPT_OSS.default_aux_layers(24) == (1, 11, 20)
    assert "mxfp4" in GPT_OSS.native_quant_methods


@pytest.mark.parametrize("name, layers, experts, total_b, active_b", [("gpt-oss-120b", 36, 128, 116.83, 5.13), ("gpt-oss-20b", 24, 32, 20.91, 3.61)])
def test_total_and_active_parameters_by_hand(name, layers, experts, total_b, active_b):
    s = parse_shape(_cfg(name))
    assert (s.experts, s.active_experts, s.window_layers, s.sliding_window) == (experts, 4, layers // 2, 128)
    p = count_target(s)
    attn = 2 * H * HEADS * HD + 2 * H * KV * HD + (HEADS * HD + 2 * KV * HD + H) + HEADS  # weights, biases, sinks
    per_expert = 3 * H * I + 2 * I + H  # gate_up [2I, H] + down [H, I] and their biases
    router = experts * H + experts
    per_layer = attn + experts * per_expert + router + 2 * H
    total = layers * per_layer + H + 2 * V * H
    assert p.total == total and round(total / 1e9, 2) == total_b
    # OpenAI's "active": what a token runs through, without the embedding lookup
    active = total - layers * (experts - 4) * per_expert - V * H
    assert p.active == active and round(active / 1e9, 2) == active_b


def _hand_plan(gpu: str) -> dict:
    """Per-GPU memory of gpt-oss-120b at TP8 x EP4 (TensorRT-LLM's guide), BF16 KV (the guide sets no KV dtype),
    K=3, 8192 tokens."""
    L, E, tp, ep, k, seq = 36, 128, 8, 4, 3, 8192
    experts_w = E * 3 * H * I
    bf16_small = (HEADS * HD + 2 * KV * HD + H) + HEADS + E * (2 * I + H) + E * H + E  # biases, sinks, router
    attn_w = 2 * H * HEADS * HD + 2 * H * KV * HD
    weights = L * (experts_w * MXFP4 + attn_w * 2 + bf16_small * 2) / tp + 2 * V * H * 2 / tp + (L * 2 * H + H) * 2
    expert_bytes = L * (E // ep) * (3 * H * I) * MXFP4 / (tp // ep)
    # draft: fc [H, 3H], first layer q/k/v over 2H (32 heads x 128, 8 KV heads), o, MLP 16384, 3 norms + final,
    # lm_head over 32000 draft tokens; BF16 and replicated, plus the int32 d2t
    draft = (H * 3 * H + 2 * H * 4096 + 2 * 2 * H * 1024 + 4096 * H + 3 * H * 16384 + 4 * H + 32000 * H) * 2 + 32000 * 4
    mbs, mnt = 128, 8192
    act = (2 * H + (HEADS * HD + 2 * KV * HD) // tp + HEADS * HD // tp + 3 * I * 4 // tp) * 2 * mnt
    reserve = 1e9 + 5e8 + act + mnt * 3 * H * 2 + (mbs * (k + 1) * V * 4 + mbs * 32000 * 4) + 8 * 2e8
    free = get_gpu(gpu).memory_bytes - round(weights) - draft - reserve
    kv_cache = int(free * 0.8)  # the guide's free_gpu_memory_fraction
    # every layer keeps KV for the whole sequence (TensorRT-LLM gives sliding-window layers max_seq_len too when
    # no max_attention_window is set): 36 layers x K,V x 1 KV head per GPU x 64 x BF16, + the draft layer (head_dim 128)
    kv_tok = 2 * 36 * (KV // tp) * HD * 2 + 2 * 1 * (8 // tp) * 128 * 2
    blocks = math.ceil((seq + k) / 32)
    return {
        "weights": round(weights),
        "experts": round(expert_bytes),
        "draft": draft,
        "reserve": int(reserve),
        "kv_cache": kv_cache,
        "kv_token": kv_tok,
        "sequences": kv_cache // (kv_tok * 32) // blocks,
    }


@pytest.mark.parametrize("gpu, weights_gb, sequences", [("h100", 8.16, 728), ("b200", 8.16, 1796)])
def test_8_gpu_plans_at_the_guides_tp8_ep4_recomputed_by_hand(gpu, weights_gb, sequences):
    plan = plan_for_preset("gpt-oss-120b", gpu, 8, None, tp=8)
    want = _hand_plan(gpu)
    assert plan.quant == "native" and (plan.tp, plan.moe_ep, plan.moe_tp, plan.experts_per_gpu) == (8, 4, 2, 32)
    assert plan.target_weight_bytes_per_gpu == want["weights"] and round(want["weights"] / 1e9, 2) == weights_gb
    assert plan.expert_bytes_per_gpu == want["experts"] == 7_614_259_200
    assert plan.draft_weight_bytes_per_gpu == want["draft"]
    assert plan.reserve.total == want["reserve"]
    assert plan.kv_bytes_per_token_target + plan.kv_bytes_per_token_draft == want["kv_token"] == 9728
    assert plan.kv_cache_bytes_per_gpu == want["kv_cache"]
    assert plan.sequences_at_max_seq_len == want["sequences"] == sequences
    assert plan.free_gpu_memory_fraction == 0.8 and not plan.kv_block_reuse


def test_sliding_window_layers_cost_as_much_kv_as_full_ones():
    """As TensorRT-LLM allocates them with no max_attention_window (KVCacheManager gives every layer
    max_seq_len): the same model with every layer full-attention plans the same KV and sequences, and the
    plan says why."""
    cfg = _cfg("gpt-oss-120b")
    full = {**cfg, "layer_types": ["full_attention"] * 36}
    draft = read_config(CONFIGS / "gpt-oss-120b" / "draft" / "config.json")
    a = plan_for_preset("gpt-oss-120b", "h100", 8, None, tp=8, target_cfg=cfg, draft_cfg=draft)
    b = plan_for_preset("gpt-oss-120b", "h100", 8, None, tp=8, target_cfg=full, draft_cfg=draft)
    assert (a.kv_bytes_per_token_target, a.sequences_at_max_seq_len) == (b.kv_bytes_per_token_target, b.sequences_at_max_seq_len)
    assert any("18 of 36 layers use a 128-token sliding window" in n and "max_attention_window" in n for n in a.notes)


def test_moe_backend_follows_the_guides_per_gpu_generation(tmp_path):
    """TRTLLM on Blackwell (the EAGLE-3 guide), TRITON on Hopper (the gpt-oss README); none for dense targets."""
    assert plan_for_preset("gpt-oss-120b", "b200", 8, None, tp=8).moe_backend == "TRTLLM"
    assert plan_for_preset("gpt-oss-120b", "h100", 8, None, tp=8).moe_backend == "TRITON"
    assert plan_for_preset("llama3.1-8b", "h100", 1, None).moe_backend is None


def test_dry_run_engine_records_native_and_follows_the_guide(tmp_path):
    """`make engine MODEL=gpt-oss-120b GPU=b200 DRY_RUN=1`, with the guide's TP8."""
    res = build_bundle(EngineRequest(preset=load_preset("gpt-oss-120b"), target_gpu="b200", tp=8, dry_run=True, out=str(tmp_path / "b")))
    man = json.loads((res.bundle / "manifest.json").read_text())
    assert man["quant"]["target"] == "native" and man["quant"]["target_native"] == "mxfp4"
    opts = yaml.safe_load((res.bundle / "llm_api_options.yaml").read_text())
    assert opts["tensor_parallel_size"] == 8 and opts["moe_expert_parallel_size"] == 4
    assert opts["kv_cache_config"]["free_gpu_memory_fraction"] == 0.8 and opts["kv_cache_config"]["enable_block_reuse"] is False
    assert opts["speculative_config"]["max_draft_len"] == 3 and opts["moe_config"] == {"backend": "TRTLLM"}
    assert opts["kv_cache_config"]["dtype"] == "auto"  # native: no calibrated k/v scales, and the guide sets no KV dtype
    val = json.loads((res.bundle / "validation.json").read_text())
    fam = next(c["detail"] for c in val["checks"] if c["check"] == "target_family")
    assert fam.startswith("gpt-oss (GptOssForCausalLM;") and "default aux layers [1, 17, 32]" in fam


def test_llama_options_keep_their_defaults(tmp_path):
    res = build_bundle(EngineRequest(preset=load_preset("llama3.1-8b"), target_gpu="h100", dry_run=True, out=str(tmp_path / "b")))
    opts = yaml.safe_load((res.bundle / "llm_api_options.yaml").read_text())
    assert "moe_expert_parallel_size" not in opts and "moe_config" not in opts
    assert opts["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9 and opts["kv_cache_config"]["enable_block_reuse"] is True


# ---- bad input, one line each ------------------------------------------------------------------------
def _one_line(fn) -> str:
    with pytest.raises(UserError) as e:
        fn()
    line = e.value.line()
    assert "\n" not in line
    return line


def test_fp8_on_an_mxfp4_target_is_refused_with_a_hint_to_native(tmp_path):
    line = _one_line(lambda: plan_for_preset("gpt-oss-120b", "h100", 8, "fp8"))
    assert "--quant: fp8 on a target that ships MXFP4 weights" in line and "use --quant native" in line
    line = _one_line(
        lambda: build_bundle(EngineRequest(preset=load_preset("gpt-oss-20b"), target_gpu="b200", quant="nvfp4", dry_run=True, out=str(tmp_path / "b")))
    )
    assert "use --quant native" in line


def test_native_on_an_unquantized_target_is_refused():
    line = _one_line(lambda: plan_for_preset("llama3.1-8b", "h100", 1, "native"))
    assert "not quantized" in line and "--quant bf16, fp8 or nvfp4" in line


def test_head_of_another_family_or_size_is_refused(tmp_path):
    # the Llama-3.1-8B head (hidden 4096, vocab 128256) on gpt-oss-120b
    line = _one_line(
        lambda: build_bundle(
            EngineRequest(
                preset=load_preset("gpt-oss-120b"),
                target_gpu="b200",
                dry_run=True,
                out=str(tmp_path / "b"),
                target=str(CONFIGS / "gpt-oss-120b" / "target"),
                draft=str(CONFIGS / "llama3.1-8b" / "draft"),
            )
        )
    )
    assert "this head belongs to another target" in line


def test_unknown_family_is_refused_listing_gpt_oss(tmp_path):
    shutil.copytree(CONFIGS / "gpt-oss-120b", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "target" / "config.json").read_text())
    (tmp_path / "m" / "target" / "config.json").write_text(json.dumps({**cfg, "model_type": "deepseek_v3"}))
    line = _one_line(
        lambda: build_bundle(
            EngineRequest(
                preset=load_preset("gpt-oss-120b"),
                target_gpu="b200",
                dry_run=True,
                out=str(tmp_path / "b"),
                target=str(tmp_path / "m" / "target"),
                draft=str(tmp_path / "m" / "draft"),
            )
        )
    )
    assert "'deepseek_v3' is not a target family" in line and "gpt-oss (model_type gpt_oss)" in line


def test_layer_types_of_the_wrong_length_are_refused():
    line = _one_line(lambda: parse_shape({**_cfg("gpt-oss-20b"), "layer_types": ["full_attention"] * 3}, "config.json"))
    assert "layer_types" in line and "3 entries for 24 layers" in line


# ---- stage 2: the reference runtime on a tiny gpt-oss-architecture target ----------------------------
# transformers' GptOssForCausalLM with random weights (MoE, alternating sliding-window layers of window 4,
# attention sinks drawn large enough to matter). MXFP4 does not run on a CPU: the tiny target is dense
# BF16/FP32 random weights, so this checks the architecture (MoE routing, sinks, windows), not MXFP4 numerics.
TINY = dict(
    model_type="gpt_oss",
    architectures=["GptOssForCausalLM"],
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    vocab_size=96,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"] * 2,
    max_position_embeddings=256,
    rope_theta=150000.0,
    rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False},
    tie_word_embeddings=False,
    attention_bias=True,
    eos_token_id=None,
    pad_token_id=0,
)


def _tiny_gpt_oss(dtype, **over):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = {**TINY, **over}
    hcfg = transformers.GptOssConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    hcfg._attn_implementation = "eager"  # transformers' only gpt-oss attention (sinks)
    ref = transformers.GptOssForCausalLM(hcfg).eval()
    with torch.no_grad():
        for n, prm in ref.named_parameters():
            if n.endswith("sinks"):
                prm.normal_(0, 2.0)
            elif n.endswith("lm_head.weight"):
                prm.mul_(20.0)  # peaked logits: greedy ties do not decide the comparison
    return cfg, ref.to(dtype)


def test_runtime_target_matches_transformers_gpt_oss_with_windows_and_sinks():
    import torch

    from eagle3_trt.core.target import TargetModel

    cfg, ref = _tiny_gpt_oss(torch.float32)
    tm = TargetModel.from_state_dict(cfg, dict(ref.state_dict()), aux_layer_ids=(1, 2))
    assert tm.hf.config._attn_implementation == "eager" and tm.sliding_window == 4
    ids = torch.randint(1, 96, (2, 12))
    with torch.no_grad():
        want = ref(ids).logits
        hidden = ref(ids, output_hidden_states=True).hidden_states
    aux, h = tm.teacher_forced(ids)
    assert (tm.hf.lm_head(h) - want).abs().max() < 2e-3  # yarn tables: TensorRT-LLM's, equal to rounding (logits x20)
    # aux = outputs of decoder layers 1 and 2 (transformers' hidden_states[i + 1])
    assert torch.allclose(aux, torch.cat([hidden[2], hidden[3]], -1), atol=1e-4)
    # the window and the sinks both change the result: the comparison above checks them
    _, wide = _tiny_gpt_oss(torch.float32, sliding_window=64)
    with torch.no_grad():
        assert (wide(ids).logits - want).abs().max() > 1e-2


def _tiny_engine(dtype, window: bool = True):
    import torch

    from eagle3_trt.core.draft import Eagle3Draft
    from eagle3_trt.core.engine import SpeculativeEngine
    from eagle3_trt.core.target import TargetModel
    from eagle3_trt.formats.draft_config import DraftConfig

    cfg, ref = _tiny_gpt_oss(dtype)
    aux = (0, 1, 2)  # 4 layers: TensorRT-LLM's {1, L//2-1, L-4} needs more than 5, so three distinct early layers
    tm = TargetModel.from_state_dict(cfg, dict(ref.state_dict()), dtype=dtype, aux_layer_ids=aux)
    if not window:
        tm.sliding_window = 0  # what the runtime did before: every layer full attention
    dc = DraftConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=256,
        vocab_size=96,
        draft_vocab_size=96,
        target_hidden_size=64,
        aux_layer_ids=aux,
        num_aux_layers=3,
        torch_dtype=str(dtype).replace("torch.", ""),
        source_format="toy",
    )
    torch.manual_seed(1)
    draft = Eagle3Draft(dc).to(dtype).eval()
    return ref, SpeculativeEngine(tm, draft, None, max_draft_len=3, max_seq_len=256)


def _greedy(ref, p: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        return ref.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p) :].tolist()


def test_speculative_decoding_on_tiny_gpt_oss_is_lossless():
    """Verification over caches longer than the window, a batch of prompts of different lengths (left
    padding), K=3 drafts from a random head: the output equals transformers' own greedy generation
    (FP32, so that no rounding decides a greedy tie), and it would not without the window."""
    import torch

    from eagle3_trt.core.engine import SamplingParams

    ref, eng = _tiny_engine(torch.float32)
    torch.manual_seed(5)
    prompts = [[int(t) for t in torch.randint(1, 96, (n,))] for n in (11, 6)]
    want = [_greedy(ref, p, 20) for p in prompts]
    assert [r.token_ids for r in eng.generate(prompts, SamplingParams(max_tokens=20))] == want
    assert [r.token_ids for r in eng.generate(prompts, SamplingParams(max_tokens=20), speculate=False)] == want
    _, full = _tiny_engine(torch.float32, window=False)
    assert [r.token_ids for r in full.generate(prompts, SamplingParams(max_tokens=20))] != want


def test_alpha_on_a_bf16_tiny_gpt_oss_with_a_random_head():
    """BF16 as the issue asks: the loop runs, drafts, verifies and measures acceptance (a random head:
    alpha is measured, not expected to be high)."""
    import torch

    from eagle3_trt.core.engine import SamplingParams

    _, eng = _tiny_engine(torch.bfloat16)
    torch.manual_seed(5)
    prompts = [[int(t) for t in torch.randint(1, 96, (n,))] for n in (11, 6, 9)]
    res = eng.generate(prompts, SamplingParams(max_tokens=16))
    drafted = sum(r.stats.draft_tokens for r in res)
    accepted = sum(r.stats.accepted_tokens for r in res)
    assert all(len(r.token_ids) == 16 for r in res) and drafted >= 3 * 16
    assert accepted <= drafted
