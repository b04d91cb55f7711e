"""Planner arithmetic against hand-computed Llama-3.1-8B / Llama-3.3-70B figures, and refusals.

Every expected number below is derived by hand in the comment next to it from the config
fields (the Hugging Face config.json files copied in build/model_configs/), not from the planner, so a change in the planner's arithmetic fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eagle3_trt.cli import main
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.gpu_checks import check_formats
from eagle3_trt.pipeline.gpus import GPUS, KV_MIN_SM, MIN_SM, check_kv_for_gpu, check_quant_for_gpu, get_gpu
from eagle3_trt.pipeline.memory import graph_batch_sizes, kv_bytes_per_token, target_weight_bytes
from eagle3_trt.pipeline.model_size import count_draft, count_target, parse_shape, read_config
from eagle3_trt.pipeline.plan_presets import MODEL_CONFIG_DIR, plan_for_preset
from eagle3_trt.pipeline.plan_report import format_plan, plan_steps
from eagle3_trt.pipeline.planner import make_plan

T70 = read_config(MODEL_CONFIG_DIR / "llama3.3-70b/target/config.json")
D70 = read_config(MODEL_CONFIG_DIR / "llama3.3-70b/draft/config.json")
T8 = read_config(MODEL_CONFIG_DIR / "llama3.1-8b/target/config.json")
D8 = read_config(MODEL_CONFIG_DIR / "llama3.1-8b/draft/config.json")
KIB = 1024


# --- config files -------------------------------------------------------------------------


def test_model_configs_carry_the_published_fields():
    for cfg, (h, layers, heads, inter) in ((T70, (8192, 80, 64, 28672)), (T8, (4096, 32, 32, 14336))):
        assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["intermediate_size"]) == (h, layers, heads, inter)
        assert cfg["num_key_value_heads"] == 8 and cfg["head_dim"] == 128 and cfg["vocab_size"] == 128256
        assert cfg["rope_theta"] == 500000.0 and cfg["rope_scaling"]["rope_type"] == "llama3"
        assert cfg["eos_token_id"] == [128001, 128008, 128009] and cfg["bos_token_id"] == 128000
        assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "bfloat16"
    for draft, target in ((D70, T70), (D8, T8)):
        assert draft["architectures"] == ["LlamaForCausalLMEagle3"] and draft["model_type"] == "llama"
        assert draft["num_hidden_layers"] == 1 and draft["draft_vocab_size"] == 32000
        assert draft["hidden_size"] == target["hidden_size"] and draft["vocab_size"] == 128256


# --- parameter counts and bytes -----------------------------------------------------------


def test_70b_parameter_counts():
    p = count_target(parse_shape(T70))
    assert p.embed == p.lm_head == 1_050_673_152  # 128256 * 8192
    # q + o: 2 * 8192*8192 = 134,217,728; k + v: 2 * 8192*(8*128) = 16,777,216
    assert p.attn_per_layer == 150_994_944
    assert p.mlp_per_layer == 704_643_072  # 3 * 8192 * 28672
    assert p.linear == 68_451_041_280  # 80 * (150,994,944 + 704,643,072)
    assert p.norms == 1_318_912  # 80 * 2 * 8192 + 8192
    # 68,451,041,280 + 1,318,912 + 2 * 1,050,673,152 = 70.55e9 (embed_tokens and lm_head 128256*8192 each)
    assert p.total == 70_553_706_496


def test_8b_parameter_counts():
    p = count_target(parse_shape(T8))
    assert p.embed == p.lm_head == 525_336_576  # 128256 * 4096
    assert p.attn_per_layer == 41_943_040  # 2 * 4096^2 + 2 * 4096 * 1024
    assert p.mlp_per_layer == 176_160_768  # 3 * 4096 * 14336
    assert p.linear == 6_979_321_856  # 32 * 218,103,808
    assert p.total == 8_030_261_248  # + norms 266,240 + 2 * 525,336,576


def test_weight_bytes_match_facts_memory_table():
    p70, p8 = count_target(parse_shape(T70)), count_target(parse_shape(T8))
    vocab_norms_70 = (2 * 1_050_673_152 + 1_318_912) * 2  # BF16 embed + lm_head + norms = 4,205,330,432
    assert target_weight_bytes(p70, "bf16") == 141_107_412_992  # 70,553,706,496 * 2  (≈141 GB)
    assert target_weight_bytes(p70, "fp8") == 68_451_041_280 + vocab_norms_70 == 72_656_371_712  # ≈72.7 GB
    # NVFP4: 4 bit + one e4m3 scale per 16 weights = 4.5 bit = 0.5625 byte
    assert target_weight_bytes(p70, "nvfp4") == 38_503_710_720 + vocab_norms_70 == 42_709_041_152  # ≈42.7 GB
    vocab_norms_8 = (2 * 525_336_576 + 266_240) * 2  # 2,101,878,784
    assert target_weight_bytes(p8, "fp8") == 6_979_321_856 + vocab_norms_8 == 9_081_200_640  # ≈9.1 GB
    assert target_weight_bytes(p8, "nvfp4") == 3_925_868_544 + vocab_norms_8 == 6_027_747_328  # ≈6.0 GB
    # TP4 shards linear layers and embed/lm_head, not norms:
    # 68,451,041,280/4 + 2,101,346,304*2/4 + 1,318,912*2 = 17,112,760,320 + 1,050,673,152 + 2,637,824
    assert target_weight_bytes(p70, "fp8", tp=4) == 18_166_071_296


def test_draft_head_counts():
    d70 = count_draft(D70, parse_shape(T70))
    # fc 8192*3*8192 = 201,326,592; attn (q,k,v read 2H) 16384*8192 + 2*16384*1024 + 8192*8192 = 234,881,024;
    # mlp 704,643,072; norms 3*8192 + 8192 = 32,768; lm_head 32000*8192 = 262,144,000  -> ≈1.40e9 (no embed_tokens: shared with the target)
    assert (d70.fc, d70.attn, d70.mlp, d70.norms, d70.lm_head) == (201_326_592, 234_881_024, 704_643_072, 32_768, 262_144_000)
    assert d70.total == 1_403_027_456 and d70.d2t == 32000
    d8 = count_draft(D8, parse_shape(T8))
    # 50,331,648 + 67,108,864 + 176,160,768 + 16,384 + 131,072,000 -> ≈0.42e9 (the same terms at H=4096, I=14336)
    assert d8.total == 424_689_664


def test_kv_bytes_per_token():
    # 2 (K and V) * layers * kv_heads/tp * head_dim * bytes
    assert kv_bytes_per_token(80, 8, 128, "bf16", 1) == 320 * KIB
    assert kv_bytes_per_token(80, 8, 128, "fp8", 1) == 160 * KIB
    assert kv_bytes_per_token(32, 8, 128, "bf16", 1) == 128 * KIB
    assert kv_bytes_per_token(32, 8, 128, "fp8", 1) == 64 * KIB
    assert kv_bytes_per_token(1, 8, 128, "bf16", 1) == 4 * KIB  # the draft layer
    assert kv_bytes_per_token(80, 8, 128, "fp8", 4) == 40 * KIB


def test_graph_batch_sizes():
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(32) == (1, 2, 4, 8, 16, 32)
    assert graph_batch_sizes(48) == (1, 2, 4, 8, 16, 32, 48)


# --- the two "done when" plans ------------------------------------------------------------


def test_70b_fp8_on_4_h100_full_budget():
    plan = plan_for_preset("llama3.3-70b", "h100", 4, "fp8")
    # H100 memory is nvidia-smi's 81559 MiB = 85,520,809,984 B. TP1 holds 72.66 GB weights + 2.81 GB
    # draft + 5.33 GB reserve (batch 128), leaving 4.26 GB of KV = 25,664 tokens = 3 sequences of
    # 8192 (< 4 needed); TP2 is the smallest that fits -> 2 instances.
    assert (plan.tp, plan.pp, plan.instances, plan.gpu_device_ids) == (2, 1, 2, "0,1;2,3")
    assert plan.speculative and plan.max_draft_len == 4 and plan.kv_cache_dtype == "fp8"
    # 68,451,041,280/2 + 2,101,346,304*2/2 + 2,637,824
    assert plan.target_weight_bytes_per_gpu == 36_329_504_768
    assert plan.draft_weight_bytes_per_gpu == 1_403_027_456 * 2 + 32000 * 4 == 2_806_182_912
    # FP8 KV at TP2: target 2*80*4*128 = 81,920 B (80 KiB); draft 2*1*4*128 = 1,024 B
    assert (plan.kv_bytes_per_token_target, plan.kv_bytes_per_token_draft) == (81_920, 1_024)
    r = plan.reserve
    assert r.activations == (16384 + 5120 + 4096 + 43008) * 2 * 8192 == 1_124_073_472  # per-layer transients x 8192 tokens
    assert r.eagle3_hidden == 8192 * 3 * 8192 * 2 == 402_653_184  # [max_num_tokens, 3H] BF16
    assert r.logits == 32 * 5 * 128256 * 4 + 32 * 32000 * 4 == 86_179_840  # batch 32 x (K+1) rows FP32
    assert r.cuda_graphs == 6 * 200_000_000  # graphs 1..32
    assert r.total == 1_000_000_000 + 500_000_000 + 1_124_073_472 + 402_653_184 + 86_179_840 + 1_200_000_000
    # free = 85,520,809,984 - 36,329,504,768 - 2,806,182,912 - 4,312,906,496 = 42,072,215,808; x 0.9
    assert plan.kv_cache_bytes_per_gpu == 37_864_994_227
    # // (82,944 B * 32 tokens per block) = 14,266 blocks = 456,512 tokens; // ceil(8196/32)=257 blocks -> 55
    assert (plan.kv_tokens, plan.sequences_at_max_seq_len) == (456_512, 55)
    # Pass 1 (reserve sized for batch 128) leaves room for 54 sequences; the largest power of two below is 32.
    assert plan.max_batch_size == 32
    assert plan.cuda_graph_batch_sizes == (1, 2, 4, 8, 16, 32)
    assert plan.max_num_tokens == 8192 and not plan.enable_chunked_prefill
    # Per GPU the parts add up to no more than the card.
    used = plan.target_weight_bytes_per_gpu + plan.draft_weight_bytes_per_gpu + r.total + plan.kv_cache_bytes_per_gpu
    assert used <= plan.gpu_memory_bytes == 81559 * 2**20 == 85_520_809_984


def test_70b_nvfp4_on_2_b200():
    plan = plan_for_preset("llama3.3-70b", "b200", 2, "nvfp4")
    assert (plan.tp, plan.instances, plan.gpu_device_ids) == (1, 2, "0;1")
    assert plan.target_weight_bytes_per_gpu == 42_709_041_152  # all of it at TP1
    assert plan.kv_bytes_per_token == 160 * KIB + 2 * KIB  # FP8 KV, 80 target layers + 1 draft layer
    assert plan.reserve.nccl == 0  # single-GPU instances need no all-reduce buffers
    # B200 = 183359 MiB = 192,265,846,784 B; reserve 4,954,724,352 (batch 64);
    # free = 192,265,846,784 - 42,709,041,152 - 2,806,182,912 - 4,954,724,352 = 141,795,898,368; x 0.9
    assert plan.gpu_memory_bytes == 192_265_846_784
    assert plan.kv_cache_bytes_per_gpu == 127_616_308_531
    # // (165,888 * 32) = 24,040 blocks = 769,280 tokens; // 257 = 93 sequences; batch 64 = 2^6 <= 93
    assert (plan.kv_tokens, plan.sequences_at_max_seq_len, plan.max_batch_size) == (769_280, 93, 64)


def test_preset_quant_defaults_by_generation():
    assert plan_for_preset("llama3.3-70b", "b200", 2, None).quant == "nvfp4"
    assert plan_for_preset("llama3.3-70b", "h100", 4, None).quant == "fp8"


# --- 8-GPU node ----------------------------------------------------------------------------


def test_8_gpu_node_plans():
    bf16 = plan_for_preset("llama3.3-70b", "h100", 8, "bf16")
    # TP2: 70.56 GB weights + 2.81 GB draft + 4.97 GB reserve (batch 128) on 85.52 GB leaves 6.47 GB
    # of FP8 KV (82,944 B/token) = 2,437 blocks = 9 sequences of 8192 -> TP2 fits, 4 instances.
    assert (bf16.tp, bf16.instances, bf16.gpu_device_ids) == (2, 4, "0,1;2,3;4,5;6,7")
    assert bf16.target_weight_bytes_per_gpu == 141_107_412_992 // 2 + 1_318_912 * 2 // 2  # norms not sharded
    assert bf16.max_batch_size == 8  # largest power of two <= 9
    tp8 = plan_for_preset("llama3.3-70b", "h100", 8, "fp8", tp=8)  # TensorRT-LLM CI's layout
    assert (tp8.tp, tp8.instances, tp8.gpu_device_ids) == (8, 1, "0,1,2,3,4,5,6,7")
    assert tp8.kv_bytes_per_token == 20 * KIB + 256  # 2*80*1*128 + 2*1*1*128
    assert tp8.max_batch_size == 128 and tp8.cuda_graph_batch_sizes[-1] == 128  # capped at the CUDA-graph default


def test_8b_fits_one_gpu_and_uses_all_gpus_as_instances():
    plan = plan_for_preset("llama3.1-8b", "h100", 8, "fp8")
    assert (plan.tp, plan.instances) == (1, 8) and plan.target_weight_bytes_per_gpu == 9_081_200_640
    assert plan.kv_bytes_per_token == 64 * KIB + 2 * KIB


# --- refusals -----------------------------------------------------------------------------


def test_refuses_nvfp4_on_hopper():
    with pytest.raises(UserError) as e:
        plan_for_preset("llama3.3-70b", "h100", 4, "nvfp4")
    assert e.value.where == "--quant" and "Blackwell" in e.value.what and "fp8" in e.value.hint


def test_refuses_70b_bf16_on_one_h100():
    with pytest.raises(UserError) as e:
        plan_for_preset("llama3.3-70b", "h100", 1, "bf16")
    assert "does not fit on 1x h100" in e.value.what and "141.1 GB weights" in e.value.what
    assert "85.52 GB" in e.value.what
    assert "--gpus 2 (TP2)" in e.value.hint and "--quant fp8" in e.value.hint
    assert "max-seq-len" not in e.value.hint  # the weights alone overflow; a shorter context cannot help


def test_refuses_explicit_tp_too_small():
    with pytest.raises(UserError) as e:
        plan_for_preset("llama3.3-70b", "h100", 4, "bf16", tp=1)
    assert e.value.where == "--tp" and "--tp 2" in e.value.hint


def test_refuses_tp_not_dividing_heads():
    with pytest.raises(UserError) as e:
        plan_for_preset("llama3.3-70b", "h100", 4, "fp8", tp=3)
    assert "does not divide num_key_value_heads (8)" in e.value.what


def test_refuses_pipeline_parallel_with_speculation():
    with pytest.raises(UserError) as e:
        plan_for_preset("llama3.3-70b", "h100", 8, "fp8", tp=4, pp=2)
    assert e.value.where == "--pp" and "speculative" in e.value.what


def test_pipeline_parallel_without_draft_is_planned():
    h100 = get_gpu("h100")
    plan = make_plan(T70, None, h100, 4, "fp8", 8192, "fp8", 4, tp=2, pp=2, model="llama3.3-70b")
    assert not plan.speculative and plan.max_draft_len == 0 and plan.draft_weight_bytes_per_gpu == 0
    # 40 layers per stage: 40*855,638,016/2 + one of embed/lm_head 1,050,673,152*2/2 + norms (40*16384+8192)*2
    assert plan.target_weight_bytes_per_gpu == 17_112_760_320 + 1_050_673_152 + 1_327_104
    assert plan.kv_bytes_per_token == 2 * 40 * 4 * 128  # 40 layers, 4 KV heads per GPU, FP8


def test_refuses_more_gpus_than_given():
    with pytest.raises(UserError) as e:
        plan_for_preset("llama3.3-70b", "h100", 4, "fp8", tp=8)
    assert "needs 8 GPUs" in e.value.what
    with pytest.raises(UserError) as e:
        make_plan(T70, None, get_gpu("h100"), 2, "fp8", 8192, "fp8", 0, pp=4)
    assert e.value.where == "--pp" and "only 2 given" in e.value.what


def test_refuses_context_beyond_the_model():
    with pytest.raises(UserError) as e:
        plan_for_preset("llama3.1-8b", "h100", 1, "fp8", max_seq_len=200_000)
    assert "131072" in e.value.what


def test_tiny_is_refused_without_configs_and_planned_with_them():
    with pytest.raises(UserError) as e:
        plan_for_preset("tiny", "h100", 1, None)
    assert "generated files" in e.value.what
    tiny = {
        "hidden_size": 64,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
    }
    plan = plan_for_preset("tiny", "h100", 1, None, target_cfg=tiny, draft_cfg={**tiny, "num_hidden_layers": 1})
    assert plan.tp == 1 and plan.max_batch_size == 128 and plan.target.total == count_target(parse_shape(tiny)).total


def test_tied_embeddings_have_no_separate_lm_head():
    p = count_target(parse_shape({**T8, "tie_word_embeddings": True}))
    assert p.lm_head == 0 and p.total == 8_030_261_248 - 525_336_576


def test_missing_config_field_is_a_user_error():
    with pytest.raises(UserError) as e:
        parse_shape({k: v for k, v in T8.items() if k != "hidden_size"}, "target config.json")
    assert e.value.line().startswith("target config.json:hidden_size: missing required field")
    # the planner reads configs through the same strict schema as validate and engine
    with pytest.raises(UserError) as e:
        parse_shape({**T8, "hidden_size": "4096"}, "target config.json")
    assert e.value.line().startswith('target config.json:hidden_size: must be a valid integer, got "4096"')


# --- output ------------------------------------------------------------------------------


def test_plan_serialises_and_formats():
    plan = plan_for_preset("llama3.3-70b", "h100", 4, "fp8")
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["tp"] == 2 and d["kv_bytes_per_token"] == 82_944 and d["reserve"]["cuda_graphs"] == 1_200_000_000
    text = format_plan(plan)
    for needle in ("85.52 GB each", "TP2 x PP1", "0,1;2,3", "72.66 GB at fp8", "36.33 GB", "456,512 tokens", "55 sequences", "max_batch_size 32"):
        assert needle in text, needle


def test_plan_steps():
    steps = plan_steps(plan_for_preset("llama3.3-70b", "h100", 4, "fp8"))
    assert len(steps) == 5
    assert steps[1].startswith("calibrate + quantize target to fp8") and "141.11 GB" in steps[1]
    assert "~" in steps[1] and "min" in steps[1]  # 141 s load + 3.7e16 FLOP at 15% of 989 TFLOPS ≈ 6.5 min
    assert steps[4].startswith("compile on GPU") and "6 CUDA graphs" in steps[4]
    bf16 = plan_steps(plan_for_preset("llama3.3-70b", "h100", 8, "bf16"))
    assert "skipped" in bf16[1]


def test_planner_does_not_import_torch():
    code = "import sys, eagle3_trt.pipeline.plan_presets as p; p.plan_for_preset('llama3.1-8b','h100',1,'fp8'); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpu_memory_is_what_nvidia_smi_reports():
    # nvidia-smi totals of the boards (MiB), shown in decimal GB; not the marketing "80/141/180 GB".
    for name, mib, gb in (("h100", 81559, 85.52), ("h200", 143771, 150.75), ("b200", 183359, 192.27)):
        g = get_gpu(name)
        assert g.memory_mib == mib and g.memory_bytes == mib * 1_048_576 and round(g.memory_gb, 2) == gb


def test_one_gpu_table_gives_build_and_preflight_the_same_answers():
    """Build time (gpus.check_*_for_gpu) and bundle preflight (gpu_checks.check_formats) read
    the same rules: for every known GPU and format both accept or both refuse."""

    def refused(fn, *a) -> bool:
        try:
            fn(*a)
        except UserError:
            return True
        return False

    for gpu in GPUS.values():
        for kv in KV_MIN_SM:
            assert refused(check_kv_for_gpu, kv, gpu) == refused(check_formats, {"kv_cache": kv}, gpu.sm, gpu.name), (gpu.name, kv)
        for q in MIN_SM:
            assert refused(check_quant_for_gpu, q, gpu) == refused(check_formats, {"target": q}, gpu.sm, gpu.name), (gpu.name, q)
    # TensorRT-LLM's hardware support matrix: FP8 KV cache on Ampere, FP8 weights from Ada, NVFP4 on Blackwell
    assert not refused(check_kv_for_gpu, "fp8", get_gpu("a100"))
    assert refused(check_quant_for_gpu, "fp8", get_gpu("a100")) and not refused(check_quant_for_gpu, "fp8", get_gpu("l40s"))
    assert refused(check_quant_for_gpu, "nvfp4", get_gpu("h200")) and not refused(check_quant_for_gpu, "nvfp4", get_gpu("b200"))
    with pytest.raises(UserError, match="nvfp4 KV cache needs Blackwell"):
        check_kv_for_gpu("nvfp4", get_gpu("h100"))


def test_plan_preset_file_reads_its_own_checkpoint_configs(tmp_path, capsys):
    """`plan --preset-file` plans a preset outside the registry from its checkpoints' config.json;
    a registry name never doubles as a path, and exactly one of the two is required."""
    src = MODEL_CONFIG_DIR / "llama3.3-70b"
    f = tmp_path / "mine.yaml"
    f.write_text(f"name: mine\ntarget:\n  source: {src / 'target'}\ndraft:\n  source: {src / 'draft'}\nmax_draft_len: 5\n")
    assert main(["plan", "--preset-file", str(f), "--gpus", "4", "--json"]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert main(["plan", "llama3.3-70b", "--gpus", "4", "--json"]) == 0
    reg = json.loads(capsys.readouterr().out)
    # same checkpoints -> same memory plan; the preset's own K is the one planned
    assert mine["target"] == reg["target"] and mine["draft"] == reg["draft"] and mine["tp"] == reg["tp"]
    assert mine["max_draft_len"] == 5 and reg["max_draft_len"] != 5
    assert main(["plan", "llama3.3-70b", "--preset-file", str(f)]) == 2
    assert main(["plan", str(f)]) == 2
    assert "never a path" in capsys.readouterr().err
