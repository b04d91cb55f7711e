"""Draft heads are measured as TensorRT-LLM serves them.

The reference runtime's draft (core/draft.py) is compared, for every variant flag it implements,
with an independent re-derivation written here from TensorRT-LLM's Eagle3 code
(tensorrt_llm/_torch/models/modeling_speculative.py @ 00679c66c3e38f6d2651ad0a5bef0f94d862e36c:
Eagle3ForCausalLM.apply_eagle3_fc, Eagle3DraftModel.forward, Eagle3DecoderLayer.forward), sharing
no code with core/draft.py. A head exported with ModelOpt's default EAGLE-3 config goes through
validate, engine, engine --quantize-draft and alpha.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from eagle3_trt.cli import main
from eagle3_trt.convert.draft_format import for_max_seq_len, load_draft
from eagle3_trt.convert.load import load_engine
from eagle3_trt.convert.target import read_target
from eagle3_trt.convert.validate import validate_pair
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.errors import UserError
from eagle3_trt.formats.draft_config import trtllm_config
from eagle3_trt.testing.tiny_pair import make_pair


# ---------------------------------------------------------------------------------------------
# the naive re-derivation (TensorRT-LLM pseudo-code, float32, no KV cache)
# ---------------------------------------------------------------------------------------------
def rms(x, w, eps):
    v = x.float()
    return w * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def naive_rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos[:, None].double() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos().float(), torch.cat([ang, ang], -1).sin().float()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def naive_step(W, c, embeds, hidden=None, aux=None):
    """One draft pass over S positions (causal). Returns (hidden fed to the next step, logits)."""
    eps, H = c["rms_norm_eps"], c["hidden_size"]
    ec = c.get("eagle_config", {})
    if aux is not None:  # apply_eagle3_fc
        h = aux
        if h.shape[-1] != H:
            if c.get("fc_norm"):
                n = h.shape[-1] // c["target_hidden_size"]
                h = torch.cat([rms(ch, W[f"fc_norm.{i}.weight"], eps) for i, ch in enumerate(h.chunk(n, -1))], -1)
            elif ec.get("norm_before_fc"):
                h = rms(h, W["input_norm.weight"], eps)
            h = h @ W["fc.weight"].T + (W["fc.bias"] if c.get("bias") else 0)
    else:
        h = hidden
    if ec.get("eh_proj_before_attn"):
        h = torch.cat([rms(embeds, W["enorm.weight"], eps), h], -1) @ W["eh_proj.weight"].T
        if ec.get("eh_proj_bias"):
            h = h + W["eh_proj.bias"]
    regular = bool(ec.get("eh_proj_before_attn"))
    residual = h
    x = rms(h, W["midlayer.hidden_norm.weight"], eps)
    if not regular:
        x = torch.cat([rms(embeds, W["midlayer.input_layernorm.weight"], eps), x], -1)
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    S = x.shape[0]
    pos = torch.arange(S)
    q = (x @ W["midlayer.self_attn.q_proj.weight"].T).view(S, nh, hd).transpose(0, 1)
    k = (x @ W["midlayer.self_attn.k_proj.weight"].T).view(S, nkv, hd).transpose(0, 1)
    v = (x @ W["midlayer.self_attn.v_proj.weight"].T).view(S, nkv, hd).transpose(0, 1)
    q, k = naive_rope(q, pos, c["rope_theta"]), naive_rope(k, pos, c["rope_theta"])
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    att = att.masked_fill(~torch.tril(torch.ones(S, S, dtype=torch.bool)), float("-inf")).softmax(-1)
    a = (att @ v).transpose(0, 1).reshape(S, nh * hd) @ W["midlayer.self_attn.o_proj.weight"].T
    residual = a + residual  # post_attention_layernorm's fused add
    y = rms(residual, W["midlayer.post_attention_layernorm.weight"], eps)
    y = (F.silu(y @ W["midlayer.mlp.gate_proj.weight"].T) * (y @ W["midlayer.mlp.up_proj.weight"].T)) @ W["midlayer.mlp.down_proj.weight"].T
    prenorm = y + residual
    normed = rms(prenorm, W["norm.weight"], eps)
    logits = normed @ W["lm_head.weight"].T
    post = ec.get("return_hidden_post_norm") or c.get("norm_output")
    return (normed if post else prenorm), logits


# ---------------------------------------------------------------------------------------------
# heads with each variant, made from the tiny pair's draft
# ---------------------------------------------------------------------------------------------
VARIANTS = {
    "standard": ({}, {}),
    "return_hidden_post_norm": ({"return_hidden_post_norm": True}, {}),
    # a flat config's top-level norm_output is SpecForge's flag (final norm before lm_head), not post-norm
    # feedback: tests/test_peer_heads.py checks it against SpecForge's own forward
    "norm_before_fc": ({"norm_before_fc": True}, {}),
    "fc_norm (top level)": ({}, {"fc_norm": True}),
    "fc_norm wins over norm_before_fc": ({"norm_before_fc": True}, {"fc_norm": True}),
    "eh_proj_before_attn": ({"eh_proj_before_attn": True}, {}),
    "eh_proj_before_attn + eh_proj_bias": ({"eh_proj_before_attn": True, "eh_proj_bias": True}, {}),
    "fc bias": ({}, {"bias": True}),
}


def make_variant(draft_dir: Path, nested: dict, top: dict, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    cfg = json.loads((draft_dir / "config.json").read_text())
    W = load_file(str(draft_dir / "model.safetensors"))
    H, A = cfg["hidden_size"], W["fc.weight"].shape[1] // cfg["hidden_size"]

    def rnd(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    for k in list(W):  # norms that are not all ones, so pre- and post-norm differ visibly
        if k.endswith("norm.weight"):
            W[k] = (1 + rnd(H, scale=0.3)).to(torch.bfloat16)
    cfg.update(top)
    cfg["eagle_config"] = {**cfg.get("eagle_config", {}), **nested}
    W["input_norm.weight"] = 1 + rnd(A * H, scale=0.3)
    for i in range(A):
        W[f"fc_norm.{i}.weight"] = 1 + rnd(H, scale=0.3)
    W["fc.bias"] = rnd(H)
    if nested.get("eh_proj_before_attn"):
        W["enorm.weight"] = 1 + rnd(H, scale=0.3)
        W["eh_proj.weight"] = rnd(H, 2 * H)
        W["eh_proj.bias"] = rnd(H)
        del W["midlayer.input_layernorm.weight"]
        for p in ("q", "k", "v"):
            W[f"midlayer.self_attn.{p}_proj.weight"] = W[f"midlayer.self_attn.{p}_proj.weight"][:, H:].contiguous()
    save_file(W, str(draft_dir / "model.safetensors"))
    (draft_dir / "config.json").write_text(json.dumps(cfg))
    return cfg


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_matches_naive_trtllm(tiny_pair, name):
    nested, top = VARIANTS[name]
    cfg = make_variant(tiny_pair[1], nested, top)
    ck = load_draft(tiny_pair[1])
    validate_pair(read_target(tiny_pair[0]), ck, 512)  # accepted
    d = Eagle3Draft.from_checkpoint(ck, dtype=torch.float32)
    W = {k: v.float() for k, v in load_file(str(tiny_pair[1] / "model.safetensors")).items()}
    g = torch.Generator().manual_seed(1)
    H, S = cfg["hidden_size"], 7
    e1, e2 = torch.randn(S, H, generator=g), torch.randn(S, H, generator=g)
    aux = torch.randn(S, 3 * H, generator=g)
    pos = torch.arange(S)[None]
    with torch.no_grad():
        h1, l1, _ = d(e1[None], None, pos, aux=aux[None])
        h2, l2, _ = d(e2[None], h1, pos)
    n1, nl1 = naive_step(W, cfg, e1, aux=aux)
    n2, nl2 = naive_step(W, cfg, e2, hidden=n1)
    for got, want in ((h1[0], n1), (l1[0], nl1), (h2[0], n2), (l2[0], nl2)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    if (nested or top) and not nested.get("eh_proj_before_attn"):  # eh_proj changes shapes: ignoring it cannot pass
        # the same head with the flags dropped computes something else, so the comparison above can fail
        base = {k: v for k, v in cfg.items() if k not in top}
        base["eagle_config"] = {k: v for k, v in cfg["eagle_config"].items() if k not in nested}
        b1, _ = naive_step(W, base, e1, aux=aux)
        _, bl2 = naive_step(W, base, e2, hidden=b1)
        assert not torch.allclose(bl2, nl2, atol=1e-4)


@pytest.mark.parametrize("name", ["return_hidden_post_norm", "fc_norm (top level)", "eh_proj_before_attn + eh_proj_bias"])
def test_variant_heads_decode_exactly_and_export(tiny_pair, tmp_path, name):
    """Through the engine: greedy speculative output equals target-only output, and the exported
    config carries the flag where TensorRT-LLM reads it."""
    nested, top = VARIANTS[name]
    make_variant(tiny_pair[1], nested, top)
    eng = load_engine(tiny_pair[0], tiny_pair[1], dtype=torch.float32, max_draft_len=3)
    prompt = [[0, 17, 42, 99, 7, 3, 250]]
    p = SamplingParams(max_tokens=12)
    assert eng.generate(prompt, p)[0].token_ids == eng.generate(prompt, p, speculate=False)[0].token_ids
    out = trtllm_config(load_draft(tiny_pair[1]).config, {})
    for k in nested:
        assert out["eagle_config"][k] is True
    for k in top:
        assert out[k] is True


# ---------------------------------------------------------------------------------------------
# embeddings, aux order, lm_head
# ---------------------------------------------------------------------------------------------
def test_shipped_embed_tokens_is_the_targets_or_refused_when_hidden_sizes_match(tiny_pair):
    """TensorRT-LLM shares the target's embedding unless target_hidden_size != hidden_size: a shipped table
    equal to the target's is served as trained, one that differs would not be and is refused."""
    W = load_file(str(tiny_pair[1] / "model.safetensors"))
    T = load_file(str(tiny_pair[0] / "model.safetensors"))["model.embed_tokens.weight"]
    W["embed_tokens.weight"] = T.clone()
    save_file(W, str(tiny_pair[1] / "model.safetensors"))
    eng = load_engine(tiny_pair[0], tiny_pair[1], dtype=torch.float32)
    ids = torch.tensor([[3, 5, 7]])
    assert eng.draft_embed is None and torch.equal(eng.draft_embedding(ids), eng.target.embed(ids))
    W["embed_tokens.weight"] = torch.randn(512, W["fc.weight"].shape[0]).to(T.dtype)
    save_file(W, str(tiny_pair[1] / "model.safetensors"))
    with pytest.raises(UserError, match="embed_tokens.weight: differs from the target's"):
        validate_pair(read_target(tiny_pair[0]), load_draft(tiny_pair[1]), 512)


def test_own_embed_tokens_when_hidden_sizes_differ(tiny_pair):
    ck = load_draft(tiny_pair[1])
    c = replace(ck.config, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48)
    d = Eagle3Draft(c)
    assert d.embed_tokens.weight.shape == (512, 32) and d.fc.in_features == 3 * 64
    with pytest.raises(UserError, match="embed_tokens"):
        cfg = json.loads((tiny_pair[1] / "config.json").read_text())
        cfg.update(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48)
        (tiny_pair[1] / "config.json").write_text(json.dumps(cfg))
        validate_pair(read_target(tiny_pair[0]), load_draft(tiny_pair[1]), 512)


def test_unsorted_aux_layers_keep_fc_in_ascending_layer_order(tiny_pair, tmp_path):
    """Every producer (SafeAILab, ModelOpt's hooks, speculators via vLLM, SpecForge via SGLang) concatenates
    the aux states in ascending layer order whatever the list's order, and TensorRT-LLM sorts its capture:
    an unsorted list names the same set, and fc is served as stored (it used to be permuted: AL 1.92 vs 2.35)."""
    cfg = json.loads((tiny_pair[1] / "config.json").read_text())
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [4, 1, 3]}
    (tiny_pair[1] / "config.json").write_text(json.dumps(cfg))
    raw = load_file(str(tiny_pair[1] / "model.safetensors"))["fc.weight"]
    ck = load_draft(tiny_pair[1])
    assert ck.config.aux_layer_ids == (1, 3, 4) and ck.config.aux_layer_ids_as_listed == (4, 1, 3)
    assert torch.equal(ck.tensors["fc.weight"], raw)
    assert trtllm_config(ck.config, {})["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    rep = validate_pair(read_target(tiny_pair[0]), ck, 512)
    assert rep.aux_layer_ids == (1, 3, 4) and any(c["check"] == "aux_layers" and "ascending layer order" in c["detail"] for c in rep.checks)


def test_head_without_lm_head_refused_at_validate(tiny_pair):
    W = load_file(str(tiny_pair[1] / "model.safetensors"))
    del W["lm_head.weight"], W["d2t"], W["t2d"]
    save_file(W, str(tiny_pair[1] / "model.safetensors"))
    cfg = json.loads((tiny_pair[1] / "config.json").read_text())
    cfg["draft_vocab_size"] = cfg["vocab_size"]
    (tiny_pair[1] / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="lm_head"):
        validate_pair(read_target(tiny_pair[0]), load_draft(tiny_pair[1]), 512)


def test_string_flag_refused(tiny_pair):
    cfg = json.loads((tiny_pair[1] / "config.json").read_text())
    cfg["eagle_config"] = {"return_hidden_post_norm": "false"}
    (tiny_pair[1] / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="return_hidden_post_norm"):
        load_draft(tiny_pair[1])


# ---------------------------------------------------------------------------------------------
# rope: exported max_position_embeddings, mismatch warning
# ---------------------------------------------------------------------------------------------
def test_exported_max_positions_cover_max_seq_len_with_the_same_function(tiny_pair):
    cfg = json.loads((tiny_pair[1] / "config.json").read_text())
    cfg.update(max_position_embeddings=256, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    (tiny_pair[1] / "config.json").write_text(json.dumps(cfg))
    ck = load_draft(tiny_pair[1])
    big = for_max_seq_len(ck, 8192)
    out = trtllm_config(big.config, {})
    assert out["max_position_embeddings"] == 8192
    assert out["rope_scaling"]["original_max_position_embeddings"] == 1024  # TensorRT-LLM's default, now explicit
    a, b = Eagle3Draft(ck.config), Eagle3Draft(big.config)
    assert torch.equal(a.rope_freqs, b.rope_freqs) and a.rope_scale == b.rope_scale
    dyn = dict(cfg, max_position_embeddings=256, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    (tiny_pair[1] / "config.json").write_text(json.dumps(dyn))
    with pytest.raises(UserError, match="dynamic"):  # its function depends on max_position_embeddings
        validate_pair(read_target(tiny_pair[0]), load_draft(tiny_pair[1]), 512)


def test_yarn_draft_on_default_target_warns(tiny_pair):
    cfg = json.loads((tiny_pair[1] / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048}
    (tiny_pair[1] / "config.json").write_text(json.dumps(cfg))
    rep = validate_pair(read_target(tiny_pair[0]), load_draft(tiny_pair[1]), 512)
    assert any("draft rope" in w and "yarn" in w and "differs from the target" in w for w in rep.warnings)


# ---------------------------------------------------------------------------------------------
# a head exported with ModelOpt's default EAGLE-3 config, through every command
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def modelopt_head(tmp_path_factory):
    """ModelOpt's EAGLE3_DEFAULT_CFG on a tiny Llama, exported with ModelOpt's own exporter.

    Only the sizes are shrunk so the test takes seconds: hidden/vocab/max positions follow the base
    model (ModelOpt's examples do the same), and the layer is 4 heads x 16 with a 128-wide MLP instead
    of 32 x 128 and 14336. Rope, layout and eagle_config are ModelOpt's defaults: 0.4x exports yarn
    (eagle_export_rope_scaling), 0.37 llama3."""
    import modelopt.torch.speculative as mtsp  # heavy optional dependency
    from modelopt.torch.export import unified_export_hf as ueh  # heavy optional dependency
    from modelopt.torch.speculative.config import EAGLE3_DEFAULT_CFG  # heavy optional dependency

    root = tmp_path_factory.mktemp("modelopt-head")
    t, _ = make_pair(root / "pair")
    m = AutoModelForCausalLM.from_pretrained(str(t), dtype=torch.bfloat16)
    cfg = copy.deepcopy(EAGLE3_DEFAULT_CFG["config"])
    arch = cfg["eagle_architecture_config"]
    for k in ("hidden_size", "vocab_size", "max_position_embeddings"):
        if k in arch:
            arch[k] = getattr(m.config, k)
    if "draft_vocab_size" in arch:
        arch["draft_vocab_size"] = m.config.vocab_size
    arch.update(num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    if "head_dim" in arch:
        arch["head_dim"] = 16
    mtsp.convert(m, [("eagle", cfg)])
    export = getattr(ueh, "export_speculative_decoding", None) or ueh.export_hf_checkpoint  # 0.4x / 0.37
    export(m, export_dir=str(root / "head"))
    return t, root / "head"


def _one_line_refusal(rc, err):
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_modelopt_default_head_through_every_command(modelopt_head, tmp_path, capsys):
    t, head = modelopt_head
    scaling = json.loads((head / "config.json").read_text()).get("rope_scaling") or {}
    rc = main(["validate", "--target", str(t), "--draft", str(head), "--max-seq-len", "512"])
    out, err = capsys.readouterr()
    if rc != 0:
        _one_line_refusal(rc, err)
        pytest.fail(f"ModelOpt's default head refused: {err}")
    if scaling.get("rope_type") == "yarn":  # what ModelOpt 0.4x writes by default
        assert "draft rope" in out and "yarn" in out
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["Write a haiku about the sea."]}\n{"turns": ["Name three primes."]}\n')
    for extra in ([], ["--quantize-draft"]):
        b = tmp_path / ("b-q" if extra else "b")
        rc = main(["engine", "--target", str(t), "--draft", str(head), "--target-gpu", "h100", "--calib-samples", "2", "-o", str(b)] + extra)
        _, err = capsys.readouterr()
        assert rc == 0, err
        dcfg = json.loads((b / "draft" / "config.json").read_text())
        assert dcfg["max_position_embeddings"] >= 512
        if scaling.get("rope_type") in ("yarn", "llama3"):
            assert dcfg["rope_scaling"]["original_max_position_embeddings"] == scaling["original_max_position_embeddings"]
    rc = main(["alpha", str(tmp_path / "b-q"), "--prompts", str(prompts), "--turns", "first", "--max-tokens", "8", "-o", str(tmp_path / "a")])
    _, err = capsys.readouterr()
    assert rc == 0, err
    assert (tmp_path / "a" / "report.json").is_file()
