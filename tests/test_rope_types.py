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


# ---------------------------------------------------------------------------------------------
# issue 21 A: the target's rope as TensorRT-LLM reads it (partial rotary, type vs rope_type,
# original_max_position_embeddings), with TensorRT-LLM's source cited where each rule lives:
# interface.py RopeParams.from_config @ 51ea5c963794a4818ad8396a77d147fa901435d9 (and 000a01de),
# qk_norm_attention.py @ 034c3f0a0d1d5d90e5567c8d953019bdf5243b77, modeling_gpt_oss.py @
# 7924c7f1d3b4a3286b62c13fc890900295dc39cb, modeling_speculative.py @ b35ac1b64368513d215c57d2ed01d62d910df8da
# ---------------------------------------------------------------------------------------------
from eagle3_trt.formats.families import family_named
from eagle3_trt.formats.hf_compat import rope_of

TINY = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=101,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def _llama_weights(cfg: dict) -> dict:
    """A transformers LlamaForCausalLM's random weights for ``cfg`` (seeded)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("partial_rotary_factor", "rotary_dim", "rotary_pct")}))
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _phi3_from_llama(cfg: dict, sd: dict, factor: float):
    """transformers' own partial-rotary decoder (Phi3: rotates q[..., :rotary_dim] GPT-NeoX style and passes the
    rest through, as TensorRT-LLM does) holding the same weights, fused the way Phi3 stores them."""
    from transformers import Phi3Config, Phi3ForCausalLM

    pc = Phi3Config(
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg["max_position_embeddings"],
        original_max_position_embeddings=cfg["max_position_embeddings"],
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"],
        partial_rotary_factor=factor,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    m = Phi3ForCausalLM(pc).eval()
    out = {"model.embed_tokens.weight": sd["model.embed_tokens.weight"], "model.norm.weight": sd["model.norm.weight"], "lm_head.weight": sd["lm_head.weight"]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "self_attn.qkv_proj.weight"] = torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        out[p + "self_attn.o_proj.weight"] = sd[p + "self_attn.o_proj.weight"]
        out[p + "mlp.gate_up_proj.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        out[p + "mlp.down_proj.weight"] = sd[p + "mlp.down_proj.weight"]
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[p + f"{n}.weight"] = sd[p + f"{n}.weight"]
    missing, unexpected = m.load_state_dict(out, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return m


def _target_logits(cfg: dict, sd: dict, ids: torch.Tensor) -> torch.Tensor:
    from eagle3_trt.core.target import TargetModel

    tm = TargetModel.from_state_dict(cfg, dict(sd))
    _, h = tm.teacher_forced(ids)
    return tm.hf.lm_head(h).float()


@pytest.mark.parametrize("key,value", [("partial_rotary_factor", 0.5), ("rotary_pct", 0.5), ("rotary_dim", 8)])
def test_partial_rotary_target_matches_transformers_partial_rotary(key, value):
    """Llama target with half its head rotating: the reference runtime's target (transformers' LlamaForCausalLM
    with TensorRT-LLM's partial layout) against transformers' own partial-rotary model on the same weights."""
    cfg = {**TINY, key: value}
    p = rope_params.from_raw_config(cfg, family=family_named("llama"))
    assert (p.dim, p.head_dim) == (8, 16) and p.partial
    sd = _llama_weights(cfg)
    ids = torch.randint(0, TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    ours = _target_logits(cfg, sd, ids)
    ref = _phi3_from_llama(cfg, sd, 0.5)(input_ids=ids).logits.float()
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)
    # not vacuous: the whole-head rotation (what transformers' Llama computes here) is another function
    full = _target_logits(TINY, sd, ids)
    assert (full - ref).abs().max() > 1e-3


def test_partial_rotary_keeps_passed_through_channels_unscaled():
    """yarn on a partial head: TensorRT-LLM scales cos/sin of the rotated channels only."""
    from eagle3_trt.core.rope import PartialRotary, partial_layout

    cfg = {**TINY, "partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}
    p = rope_params.from_raw_config(cfg)
    cos, sin = PartialRotary(p)(torch.zeros(1), torch.arange(50)[None])
    inv, scale = rope.tables(p)
    assert scale > 1 and inv.shape == (4,)
    slots = torch.tensor([4, 5, 6, 7, 12, 13, 14, 15])  # partial_layout's passed-through slots for dim 8 of 16
    assert torch.equal(cos[..., slots], torch.ones_like(cos[..., slots])) and torch.equal(sin[..., slots], torch.zeros_like(sin[..., slots]))
    torch.testing.assert_close(cos[0, :, :4], torch.cos(torch.arange(50.0)[:, None] * inv) * scale)
    assert sorted(partial_layout(8, 16).tolist()) == list(range(16))


def test_rotary_dim_precedence_is_trtllms():
    """rotary_dim or rotary_emb_base or qk_rope_head_dim or int(head_dim * (rotary_pct or partial_rotary_factor or 1.0))."""
    ll = family_named("llama")
    dim = lambda **kw: rope_params.from_raw_config({**TINY, **kw}, family=ll).dim  # noqa: E731
    assert dim() == 16
    assert dim(rotary_pct=0.25, partial_rotary_factor=0.5) == 4  # rotary_pct first
    assert dim(rotary_dim=12, partial_rotary_factor=0.5) == 12
    assert dim(qk_rope_head_dim=6, partial_rotary_factor=0.5) == 6
    assert dim(partial_rotary_factor=0) == 16  # a falsy factor falls through to 1.0, as TensorRT-LLM's `or` does
    assert dim(partial_rotary_factor=0.3) == 4  # int() truncates: 16 * 0.3 = 4.8


@pytest.mark.parametrize(
    "family,kw,field,text",
    [
        ("llama", {"rotary_emb_base": 10000}, "rotary_emb_base", "as the rotary dim"),
        ("llama", {"rotary_dim": 7}, "rotary_dim", "rotary dim of 7 for head_dim 16"),
        ("llama", {"rotary_dim": 32}, "rotary_dim", "rotary dim of 32 for head_dim 16"),
        ("llama", {"partial_rotary_factor": 1.5}, "partial_rotary_factor", "rotary dim of 24"),
        ("llama", {"partial_rotary_factor": "half"}, "partial_rotary_factor", "not a number"),
        ("qwen3", {"rotary_pct": 0.5}, "rotary_pct", "fused QK-norm\\+RoPE"),
        ("qwen3", {"rotary_dim": 8, "head_dim": 16}, "rotary_dim", "reads partial_rotary_factor only"),
        ("qwen3", {"partial_rotary_factor": None}, "partial_rotary_factor", "null"),
        ("gpt-oss", {"partial_rotary_factor": 0.5, "head_dim": 16}, "partial_rotary_factor", "silently rotates the whole head"),
    ],
)
def test_partial_rotary_refusals(family, kw, field, text):
    fam = family_named(family)
    with pytest.raises(UserError, match=text) as e:
        rope_params.from_raw_config({**TINY, "model_type": fam.model_types[0], **kw}, "t/config.json", fam)
    assert e.value.where == f"t/config.json:{field}" and "\n" not in e.value.line()


def test_qwen3_partial_rotary_factor_is_its_only_key():
    q = family_named("qwen3")
    p = rope_params.from_raw_config({**TINY, "model_type": "qwen3", "head_dim": 16, "partial_rotary_factor": 0.5}, family=q)
    assert (p.dim, p.head_dim) == (8, 16)
    # rotary_pct 1.0 gives both of TensorRT-LLM's Qwen3 paths the whole head: nothing to refuse
    assert rope_params.from_raw_config({**TINY, "model_type": "qwen3", "head_dim": 16, "rotary_pct": 1.0}, family=q).dim == 16
    # head_dim absent: transformers' Qwen3Config default (128), which TensorRT-LLM's config carries too
    assert rope_params.from_raw_config({**TINY, "model_type": "qwen3", "partial_rotary_factor": 0.5}, family=q).dim == 64


TYPE_PAIRS = [
    # (type, rope_type) -> the kind TensorRT-LLM computes: `type` wins whenever truthy
    ("linear", "llama3", "linear"),
    ("llama3", "linear", "llama3"),
    ("yarn", "default", "yarn"),
    ("default", "yarn", "none"),
    ("linear", "default", "linear"),
    ("Linear", "yarn", "linear"),
]


@pytest.mark.parametrize("typ", ["", None])
def test_empty_type_next_to_rope_type_is_refused(typ):
    """`type` present but falsy: TensorRT-LLM's `or` falls to rope_type under transformers 5, but transformers 4.57
    (TensorRT-LLM 1.2's) copies type over rope_type first, leaving no type: the two releases serve two functions."""
    with pytest.raises(UserError, match="rope_scaling.type: .*under transformers 4.57"):
        rope_params.from_raw_config({**TINY, "rope_scaling": {"type": typ, "rope_type": "yarn", "factor": 2.0}})


@pytest.mark.parametrize("typ,rope_type,kind", TYPE_PAIRS)
def test_type_beats_rope_type_everywhere(typ, rope_type, kind):
    sc = {"type": typ, "rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    cfg = {**TINY, "rope_scaling": sc}
    assert rope_params.scaling_kind(sc) == kind
    assert rope_params.from_raw_config(cfg).kind == kind
    # rope_of (every config reader) keeps the block exactly when TensorRT-LLM scales
    assert (rope_of(cfg)[1] is None) == (kind == "none")
    # transformers-5 spelling: the block under rope_parameters resolves the same way
    cfg5 = {k: v for k, v in TINY.items() if k != "rope_theta"} | {"rope_parameters": {"rope_theta": 10000.0, **sc}}
    assert rope_params.from_raw_config(cfg5).kind == kind


@pytest.mark.parametrize("typ,rope_type,kind", [t for t in TYPE_PAIRS if t[2] != "none" and t[0] != "Linear"])
def test_target_forward_uses_trtllms_type(typ, rope_type, kind):
    """The reference runtime's target computes the type TensorRT-LLM resolves, whichever key transformers prefers."""
    from eagle3_trt.core.target import TargetModel

    sc = {"type": typ, "rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    cfg = {**TINY, "rope_scaling": sc}
    tm = TargetModel.from_state_dict(cfg, _llama_weights(TINY))
    want, scale = rope.tables(rope_params.from_config(1e4, {"rope_type": kind, **{k: v for k, v in sc.items() if "type" not in k}}, 16, 256))
    torch.testing.assert_close(tm.hf.model.rotary_emb.inv_freq, want, rtol=1e-6, atol=0)
    assert tm.hf.model.rotary_emb.attention_scaling == pytest.approx(scale)


@pytest.mark.parametrize("kind", ["llama3", "yarn", "longrope"])
def test_original_max_position_embeddings_top_level_first(kind):
    """RopeParams.from_config: getattr(config, "original_max_position_embeddings") or rope_scaling[...] or 1024.
    A value spelled at the top level and in a block with two values is refused (issue 27): TensorRT-LLM 1.2
    takes the top level's, releases on transformers 5 the block's (tests/test_rope_block.py reads both)."""
    sc = {"rope_type": kind, "factor": 4.0, "original_max_position_embeddings": 64}
    if kind == "longrope":
        sc |= {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    assert rope_params.from_raw_config({**TINY, "rope_scaling": sc}).original_max_positions == 64
    no_inner = {k: v for k, v in sc.items() if k != "original_max_position_embeddings"}
    assert rope_params.from_raw_config({**TINY, "rope_scaling": no_inner, "original_max_position_embeddings": 16}).original_max_positions == 16
    assert rope_params.from_raw_config({**TINY, "rope_scaling": no_inner}).original_max_positions == 1024
    assert rope_params.from_raw_config({**TINY, "rope_scaling": sc, "original_max_position_embeddings": 64}).original_max_positions == 64  # agreeing
    for block in ("rope_scaling", "rope_parameters"):
        bad = {**TINY, "original_max_position_embeddings": 16, block: {"rope_theta": 1e4, **sc}}
        with pytest.raises(UserError, match=f"16, but {block}.original_max_position_embeddings is 64") as e:
            rope_params.from_raw_config(bad, "t/config.json")
        assert e.value.where == "t/config.json:original_max_position_embeddings" and "\n" not in e.value.line()
    # transformers 5 spelling alone: the block's value
    cfg5 = {**{k: v for k, v in TINY.items() if k != "rope_theta"}, "rope_parameters": {"rope_theta": 1e4, **sc}}
    assert rope_params.from_raw_config(cfg5).original_max_positions == 64
    # readers that keep (theta, scaling) carry the value taken
    _, eff = rope_params.effective_scaling({**TINY, "rope_scaling": no_inner, "original_max_position_embeddings": 16})
    assert eff["original_max_position_embeddings"] == 16
    # gpt-oss builds RopeParams from rope_scaling alone: a top-level value (spelled once) does not count there
    go = family_named("gpt-oss")
    gcfg = {**TINY, "model_type": "gpt_oss", "head_dim": 16, "rope_scaling": no_inner, "original_max_position_embeddings": 16}
    if kind == "yarn":
        assert rope_params.from_raw_config(gcfg, family=go).original_max_positions == 1024


def test_llama3_top_level_original_max_reaches_the_target_tables():
    from eagle3_trt.core.target import TargetModel

    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    cfg = {**TINY, "rope_scaling": sc, "original_max_position_embeddings": 32}
    tm = TargetModel.from_state_dict(cfg, _llama_weights(TINY))
    assert cfg["rope_scaling"] == sc and "original_max_position_embeddings" not in sc  # the caller's config is left as it was
    want, _ = rope.tables(rope_params.from_config(1e4, {**sc, "original_max_position_embeddings": 32}, 16, 256))
    default, _ = rope.tables(rope_params.from_config(1e4, sc, 16, 256))
    torch.testing.assert_close(tm.hf.model.rotary_emb.inv_freq, want, rtol=1e-6, atol=0)
    assert not torch.allclose(want, default)


def test_longrope_message_names_the_value_used():
    """The longrope refusal names the original_max_position_embeddings TensorRT-LLM takes (top level: 16),
    not the 1024 default a reader that skipped the top level would show."""
    sc = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    p = rope_params.from_raw_config({**TINY, "max_position_embeddings": 8, "original_max_position_embeddings": 16, "rope_scaling": sc})
    assert "original_max_position_embeddings 16" in rope_params.describe(p)
    with pytest.raises(UserError, match=r"longrope table has 16 rows \(max_position_embeddings 8, original_max_position_embeddings 16\), max_seq_len is 64"):
        rope_params.check_supported(p, "config.json", max_seq_len=64)


@pytest.mark.parametrize(
    "sc,text",
    [
        ({"type": "", "rope_type": "yarn", "factor": 2.0}, "'': .*position embedding type .*while its rope tables use 'yarn'"),
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}, "'llama3': .*accepts only yarn"),
        ({"factor": 2.0}, None),
    ],
)
def test_qwen3_position_type(sc, text):
    q = family_named("qwen3")
    cfg = {**TINY, "model_type": "qwen3", "head_dim": 16, "rope_scaling": sc}
    if text is None:  # no type key: plain rope in RopeParams, and rope_of drops the block
        assert rope_params.from_raw_config(cfg, family=q).kind == "none"
        return
    with pytest.raises(UserError, match=text):
        rope_params.from_raw_config(cfg, "c", q)


def test_qwen3_partial_rotary_target_matches_transformers_partial_rotary(monkeypatch):
    """Qwen3 (q/k RMSNorm per head before rope): the permuted layout carries the norms' weights too. Reference:
    transformers' Qwen3ForCausalLM with transformers' own partial-rotary pieces (Phi3's rotary table and
    apply_rotary_pos_emb), i.e. int(head_dim * partial_rotary_factor) channels, as TensorRT-LLM's fused kernel."""
    from transformers import Phi3Config, Qwen3Config, Qwen3ForCausalLM
    from transformers.models.phi3 import modeling_phi3
    from transformers.models.qwen3 import modeling_qwen3

    base = {**TINY, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 16}
    cfg = {**base, "partial_rotary_factor": 0.5}
    torch.manual_seed(0)
    sd = {k: v.detach().clone() for k, v in Qwen3ForCausalLM(Qwen3Config(**base)).state_dict().items()}
    for k in sd:
        if k.endswith(("q_norm.weight", "k_norm.weight")):
            sd[k] = 1.0 + 0.5 * torch.randn_like(sd[k])  # per-channel weights, so a wrong permutation shows
    ids = torch.randint(0, TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    ours = _target_logits(cfg, sd, ids)
    full = _target_logits(base, sd, ids)
    ref = Qwen3ForCausalLM(Qwen3Config(**base)).eval()
    ref.load_state_dict(sd, strict=False)
    ref.model.rotary_emb = modeling_phi3.Phi3RotaryEmbedding(
        Phi3Config(hidden_size=64, num_attention_heads=4, rope_theta=1e4, partial_rotary_factor=0.5, max_position_embeddings=256, pad_token_id=0)
    )
    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", modeling_phi3.apply_rotary_pos_emb)
    with torch.no_grad():
        want = ref(input_ids=ids).logits.float()
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-4)
    assert (full - want).abs().max() > 1e-3


def test_exported_block_names_the_type_used_once():
    """The bundle's draft config carries the resolved type under rope_type alone: TensorRT-LLM, transformers 4.57
    and 5 then all read the function that was measured."""
    sc = {"type": "linear", "rope_type": "llama3", "factor": 2.0}
    p = rope_params.from_config(1e4, sc, HEAD_DIM, MAX_POS)
    out = rope_params.export_scaling(p, sc)
    assert out == {"rope_type": "linear", "factor": 2.0}
    q = rope_params.from_config(1e4, out, HEAD_DIM, MAX_POS)
    assert rope_params.same_function(p, q)
