"""EAGLE-3 draft heads in the three layouts users have, normalized to one internal form.

Internal form = the SafeAILab/TensorRT-LLM layout: ``fc.weight``, ``midlayer.*``, ``norm.weight``,
``lm_head.weight``, ``d2t`` (int64, target_id = draft_id + d2t[draft_id]) and optional ``t2d``,
plus a typed ``DraftConfig``. Aux layer ids are kept in TensorRT-LLM's convention: the
*output* of decoder layer i (0-based), which is the *input* of layer i+1 in SafeAILab/vLLM terms.

Sources:
- SafeAILab/SpecForge: ``LlamaForCausalLMEagle3``, ``midlayer.*`` (TensorRT-LLM loads it natively).
- ModelOpt ``export_speculative_decoding``: ``layers.0.*`` names, ``eagle_config`` block.
- vllm-project/speculators: ``Eagle3Speculator``, ``transformer_layer_config``, vLLM aux-id convention.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3_trt.convert.checkpoint_io import load_tensors, read_json
from eagle3_trt.convert.hf_compat import dtype_of, rope_of, with_legacy_fields
from eagle3_trt.errors import UserError

FORMATS = ("safeailab", "modelopt", "speculators")

# name -> shape template; H = draft hidden, T = target hidden, A = number of aux layers,
# Q = heads*head_dim, K = kv_heads*head_dim, I = intermediate, D = draft vocab.
LAYER_SCHEMA: dict[str, tuple[str, ...]] = {
    "midlayer.input_layernorm.weight": ("H",),
    "midlayer.hidden_norm.weight": ("H",),
    "midlayer.post_attention_layernorm.weight": ("H",),
    "midlayer.self_attn.q_proj.weight": ("Q", "2H"),
    "midlayer.self_attn.k_proj.weight": ("K", "2H"),
    "midlayer.self_attn.v_proj.weight": ("K", "2H"),
    "midlayer.self_attn.o_proj.weight": ("H", "Q"),
    "midlayer.mlp.gate_proj.weight": ("I", "H"),
    "midlayer.mlp.up_proj.weight": ("I", "H"),
    "midlayer.mlp.down_proj.weight": ("H", "I"),
}
HEAD_SCHEMA: dict[str, tuple[str, ...]] = {
    "fc.weight": ("H", "AT"),
    "norm.weight": ("H",),
    "lm_head.weight": ("D", "H"),
}
OPTIONAL = ("d2t", "t2d", "embed_tokens.weight", "fc.bias")


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None
    num_aux_layers: int
    torch_dtype: str | None
    source_format: str
    attention_bias: bool = False
    mlp_bias: bool = False
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DraftCheckpoint:
    path: Path
    config: DraftConfig
    tensors: dict[str, Any]
    raw_config: dict

    @property
    def has_d2t(self) -> bool:
        return "d2t" in self.tensors


def detect_format(cfg: dict, names: set[str]) -> str:
    archs = cfg.get("architectures") or []
    if cfg.get("speculators_model_type") == "eagle3" or "Eagle3Speculator" in archs:
        return "speculators"
    if any(n.startswith("midlayer.") for n in names):
        return "safeailab"
    if any(n.startswith("layers.0.") for n in names) or "eagle_config" in cfg:
        return "modelopt"
    raise UserError(
        "draft", "not an EAGLE-3 head: no midlayer.* or layers.0.* tensors and no speculators config",
        "pass the directory of an EAGLE-3 draft (SafeAILab, ModelOpt or speculators layout)",
    )


def _rename(name: str, fmt: str) -> str:
    if name.startswith("layers.0."):
        return "midlayer." + name[len("layers.0."):]
    if fmt == "modelopt" and name.startswith("eagle_module."):
        return _rename(name[len("eagle_module."):], fmt)
    return name


def _field(cfg: dict, key: str, path: Path, default: Any = ..., hint: str = "") -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise UserError(f"{path}:{key}", "missing required field", hint or "the draft config.json is incomplete")
    return default


def load_draft(path: Path) -> DraftCheckpoint:
    path = Path(path)
    raw = read_json(path / "config.json")
    tensors = load_tensors(path)
    fmt = detect_format(raw, set(tensors))
    cfg_path = path / "config.json"
    if fmt == "speculators":
        layer_cfg = raw.get("transformer_layer_config")
        if not isinstance(layer_cfg, dict):
            raise UserError(f"{cfg_path}:transformer_layer_config", "missing or not an object", "a speculators eagle3 config nests the Llama layer config there")
        base = {**layer_cfg, **{k: raw[k] for k in ("draft_vocab_size", "target_hidden_size") if k in raw}}
        aux = raw.get("eagle_aux_hidden_state_layer_ids")
        if aux is not None:
            if min(aux) < 1:
                raise UserError(f"{cfg_path}:eagle_aux_hidden_state_layer_ids", f"{aux} captures the embeddings (vLLM id 0)", "TensorRT-LLM captures decoder-layer outputs only; retrain with ids >= 1")
            aux = [i - 1 for i in aux]  # vLLM: input of layer i == TensorRT-LLM: output of layer i-1
        if raw.get("norm_before_residual"):
            extra = {"norm_before_residual": True}
        else:
            extra = {}
    else:
        base = raw
        eagle_cfg = raw.get("eagle_config") or {}
        aux = eagle_cfg.get("eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids"))
        extra = {k: eagle_cfg[k] for k in ("next_layer_regular", "eh_proj_before_attn", "norm_before_fc", "return_hidden_post_norm") if k in eagle_cfg}

    num_layers = int(_field(base, "num_hidden_layers", cfg_path, 1))
    if num_layers != 1:
        raise UserError(f"{cfg_path}:num_hidden_layers", f"{num_layers} draft decoder layers", "only single-layer EAGLE-3 heads (the published and ModelOpt layout) are supported")

    norm = {_rename(k, fmt): v for k, v in tensors.items()}
    hidden = int(_field(base, "hidden_size", cfg_path))
    heads = int(_field(base, "num_attention_heads", cfg_path))
    vocab = int(_field(base, "vocab_size", cfg_path))
    theta, scaling = rope_of(base)
    fc = norm.get("fc.weight")
    target_hidden = int(base.get("target_hidden_size") or hidden)
    n_aux = (fc.shape[1] // target_hidden) if fc is not None and target_hidden else 0
    dvs = base.get("draft_vocab_size")
    if dvs is None:
        lm = norm.get("lm_head.weight")
        dvs = lm.shape[0] if lm is not None else vocab
    cfg = DraftConfig(
        hidden_size=hidden,
        intermediate_size=int(_field(base, "intermediate_size", cfg_path)),
        num_attention_heads=heads,
        num_key_value_heads=int(base.get("num_key_value_heads") or heads),
        head_dim=int(base.get("head_dim") or hidden // heads),
        rms_norm_eps=float(base.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(_field(base, "max_position_embeddings", cfg_path, 2048)),
        vocab_size=vocab,
        draft_vocab_size=int(dvs),
        target_hidden_size=target_hidden,
        aux_layer_ids=tuple(int(i) for i in aux) if aux is not None else None,
        num_aux_layers=n_aux,
        torch_dtype=dtype_of(base),
        source_format=fmt,
        attention_bias=bool(base.get("attention_bias", False)),
        mlp_bias=bool(base.get("mlp_bias", False)),
        extra=extra,
    )
    return DraftCheckpoint(path=path, config=cfg, tensors=norm, raw_config=raw)


def expected_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    dims = {
        "H": cfg.hidden_size,
        "2H": 2 * cfg.hidden_size,
        "T": cfg.target_hidden_size,
        "AT": max(cfg.num_aux_layers, 1) * cfg.target_hidden_size,
        "Q": cfg.num_attention_heads * cfg.head_dim,
        "K": cfg.num_key_value_heads * cfg.head_dim,
        "I": cfg.intermediate_size,
        "D": cfg.draft_vocab_size,
    }
    return {k: tuple(dims[d] for d in v) for k, v in {**LAYER_SCHEMA, **HEAD_SCHEMA}.items()}


def trtllm_config(cfg: DraftConfig, raw: dict) -> dict:
    """config.json for the exported draft: the flat SafeAILab layout TensorRT-LLM's Eagle3 loader reads."""
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    if cfg.rope_scaling is not None:
        out["rope_scaling"] = cfg.rope_scaling
    eagle = dict(cfg.extra)
    if cfg.aux_layer_ids is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)
    if eagle:
        out["eagle_config"] = eagle
    for k in ("bos_token_id", "eos_token_id"):
        src = raw.get("transformer_layer_config", raw) if cfg.source_format == "speculators" else raw
        if k in src:
            out[k] = src[k]
    return with_legacy_fields(out)
