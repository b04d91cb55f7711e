"""Every rope type TensorRT-LLM accepts for a Llama-family model, against transformers' own
ROPE_INIT_FUNCTIONS (transformers 5.x in .venv, 4.57 in .venv-compat: both must pass), with the
places where TensorRT-LLM's function differs pinned as differences (TensorRT-LLM wins)."""

import inspect
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from eagle3_trt.core import rope
from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_params

HEAD_DIM, MAX_POS = 64, 4096


def hf(scaling: dict | None, theta=10000.0, max_pos=MAX_POS, seq_len=None, **top):
    cfg = LlamaConfig(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_pos,
        rope_theta=theta,
        rope_scaling=dict(scaling) if scaling else None,
        **top,
    )
    kind = rope_params.scaling_kind(scaling)
    fn = ROPE_INIT_FUNCTIONS.get(kind) if kind != "none" else None
    if fn is None:  # plain rope: 4.57 has a "default" entry, 5.x computes it inside the rotary module
        return 1.0 / (theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)), 1.0
    kw = {"seq_len": seq_len} if "seq_len" in inspect.signature(fn).parameters else {}
    inv, scale = fn(cfg, "cpu", **kw)
    return inv.float(), float(scale)


def ours(scaling: dict | None, theta=10000.0, max_pos=MAX_POS, **top):
    p = rope_params.from_config(theta, scaling, HEAD_DIM, max_pos, top_level=top)
    rope_params.check_supported(p, "config.json")
    return rope.tables(p)


AGREE = {
    "none": (None, {}),
    "default": ({"rope_type": "default"}, {}),
    "linear": ({"rope_type": "linear", "factor": 4.0}, {}),
    "linear legacy 'type' key": ({"type": "linear", "factor": 2.0}, {}),
    "llama3": (
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        {"theta": 500000.0, "max_pos": 131072},
    ),
    # ModelOpt's default export (eagle_export_rope_scaling, modelopt/torch/speculative/config.py)
    "yarn (ModelOpt default export)": ({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048}, {}),
    "yarn betas": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 16, "beta_slow": 2}, {}),
    "dynamic below max_position_embeddings": ({"rope_type": "dynamic", "factor": 2.0}, {}),
}


@pytest.mark.parametrize("name", AGREE)
def test_agrees_with_transformers(name):
    scaling, kw = AGREE[name]
    inv, scale = ours(scaling, **kw)
    ref_inv, ref_scale = hf(scaling, **kw)
    assert inv.dtype == torch.float32 and inv.shape == (HEAD_DIM // 2,)
    torch.testing.assert_close(inv, ref_inv, rtol=2e-6, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-12)


def test_yarn_actually_scales():
    """Guards the agreement test against a vacuous pass: yarn is not plain rope."""
    inv, scale = ours({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048})
    plain, _ = ours(None)
    assert scale == pytest.approx(0.1 * math.log(32.0) + 1.0)
    assert not torch.allclose(inv, plain)
    torch.testing.assert_close(inv[0], plain[0], rtol=1e-6, atol=0)  # highest frequency: extrapolated, unchanged
    torch.testing.assert_close(inv[-1], plain[-1] / 32.0, rtol=1e-5, atol=0)  # lowest: interpolated by the factor


def test_longrope_agrees_past_the_original_window():
    """TensorRT-LLM uses long_factor (no max_seq_len in the config); transformers does for sequences past
    original_max_position_embeddings. The scale sqrt(1 + ln(mpe/orig) / ln(orig)) is the same."""
    short = [1.0 + 0.01 * i for i in range(HEAD_DIM // 2)]
    long = [2.0 + 0.5 * i for i in range(HEAD_DIM // 2)]
    sc = {"rope_type": "longrope", "short_factor": short, "long_factor": long}
    inv, scale = ours(sc, original_max_position_embeddings=1024)
    ref_inv, ref_scale = hf(sc, seq_len=1025, original_max_position_embeddings=1024)
    torch.testing.assert_close(inv, ref_inv, rtol=2e-6, atol=0)
    assert scale == pytest.approx(ref_scale) and scale == pytest.approx(math.sqrt(1 + math.log(4) / math.log(1024)))
    short_inv, _ = hf(sc, seq_len=10, original_max_position_embeddings=1024)
    assert not torch.allclose(inv, short_inv)  # transformers' short-context table is what TensorRT-LLM does not use


def test_yarn_without_original_window_uses_trtllm_default():
    """RopeParams.from_config: original_max_position_embeddings defaults to 1024 (transformers: max_position_embeddings)."""
    inv, _ = ours({"rope_type": "yarn", "factor": 8.0})
    trt, _ = hf({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024})
    hf_default, _ = hf({"rope_type": "yarn", "factor": 8.0})
    torch.testing.assert_close(inv, trt, rtol=2e-6, atol=0)
    assert not torch.allclose(inv, hf_default)


def test_yarn_mscale_is_trtllms():
    """TensorRT-LLM: get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) with mscale_all_dim 0 by default;
    transformers ignores a lone mscale."""
    sc = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 2048, "mscale": 0.707}
    _, scale = ours(sc)
    _, hf_scale = hf(sc)
    assert scale == pytest.approx(0.1 * 0.707 * math.log(16.0) + 1.0)
    assert hf_scale == pytest.approx(0.1 * math.log(16.0) + 1.0) and scale != pytest.approx(hf_scale)
    both = {**sc, "mscale_all_dim": 0.707}
    assert ours(both)[1] == pytest.approx(hf(both)[1]) == pytest.approx(1.0)


def test_refusals_are_one_line_user_errors():
    with pytest.raises(UserError, match="not one TensorRT-LLM accepts"):
        rope_params.from_config(1e4, {"rope_type": "wibble"}, HEAD_DIM, MAX_POS)
    p = rope_params.from_config(1e4, {"rope_type": "mrope"}, HEAD_DIM, MAX_POS)
    with pytest.raises(UserError, match="not implemented in the reference runtime"):
        rope_params.check_supported(p, "config.json")
    p = rope_params.from_config(1e4, {"rope_type": "dynamic", "factor": 2.0}, HEAD_DIM, 2048)
    rope_params.check_supported(p, "config.json", max_seq_len=2048)
    with pytest.raises(UserError, match="max_seq_len 4096"):
        rope_params.check_supported(p, "config.json", max_seq_len=4096)
    with pytest.raises(UserError, match="alpha"):
        rope_params.check_supported(rope_params.from_config(1e4, {"type": "dynamic", "alpha": 2.0}, HEAD_DIM, 2048), "c")
    with pytest.raises(UserError, match="not a number"):
        rope_params.from_config(1e4, {"rope_type": "linear", "factor": "4"}, HEAD_DIM, MAX_POS)


def test_default_spelling_and_case():
    """RotaryScalingType.from_string: "default" is none, matching is case-insensitive, "type" wins."""
    assert rope_params.scaling_kind({"rope_type": "default"}) == "none"
    assert rope_params.scaling_kind({"type": "YaRN", "rope_type": "linear"}) == "yarn"
    assert rope_params.scaling_kind(None) == "none"


def test_exported_scaling_keeps_the_function_when_max_positions_grows():
    sc = {"rope_type": "yarn", "factor": 8.0}
    p = rope_params.from_config(1e4, sc, HEAD_DIM, 2048)
    out = rope_params.export_scaling(p, sc)
    assert out["original_max_position_embeddings"] == 1024
    q = rope_params.from_config(1e4, out, HEAD_DIM, 32768)
    assert rope_params.same_function(p, q)
    a, b = rope.tables(p), rope.tables(q)
    assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_target_rotary_gets_trtllms_yarn_table():
    """The reference runtime's target runs transformers' Llama; for yarn its rotary tables are replaced by
    TensorRT-LLM's (here: no original_max_position_embeddings, so 1024 rather than transformers' 4096)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from eagle3_trt.core.target import _trtllm_rope

    raw = dict(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POS,
        rope_theta=10000.0,
        rope_scaling={"rope_type": "yarn", "factor": 8.0},
    )
    rot = LlamaRotaryEmbedding(config=LlamaConfig(**{**raw, "rope_scaling": dict(raw["rope_scaling"])}))
    pos = torch.arange(5)[None] * 700
    hf_cos, _ = rot(torch.zeros(1, 5, 2 * HEAD_DIM), pos)
    _trtllm_rope(rot, raw)
    cos, sin = rot(torch.zeros(1, 5, 2 * HEAD_DIM), pos)
    inv, scale = rope.tables(rope_params.from_raw_config(raw))
    want_cos, want_sin = rope.cos_sin(pos, inv, torch.float32, scale)
    torch.testing.assert_close(cos, want_cos[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin, want_sin[:, 0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(hf_cos, cos, atol=1e-3)
