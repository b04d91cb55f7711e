"""The typed config of an EAGLE-3 draft head, in the three layouts users have (see
``convert.draft_format`` for the sources), read from its config.json without touching the weights.

``draft_config`` normalizes SafeAILab, ModelOpt and speculators configs into one ``DraftConfig``
(TensorRT-LLM's aux-id convention, variant flags, rope), ``expected_shapes`` lists the tensors
TensorRT-LLM loads for it, and ``trtllm_config`` writes the flat config.json it reads. What each
producer's flags mean, and what is refused, is ``formats.draft_producers``. Tensors are loaded by
``convert.draft_format.load_draft``; this module imports no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.formats import draft_producers, rope_block, rope_params
from eagle3_trt.formats.checkpoint_io import read_json, safetensors_names
from eagle3_trt.formats.families import EAGLE3_DEFAULT_NUM_AUX
from eagle3_trt.formats.hf_compat import dtype_of, rope_of, trtllm_view
from eagle3_trt.formats.hf_config import DEFAULT_MAX_POSITIONS, Eagle3DraftConfigFields, parse_config

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

# The draft-config flags TensorRT-LLM's Eagle3 loader reads (tensorrt_llm/_torch/models/
# modeling_speculative.py @ 00679c66c3e38f6d2651ad0a5bef0f94d862e36c: Eagle3DraftModel,
# Eagle3DecoderLayer, Eagle3ForCausalLM.apply_eagle3_fc), where they live and what each does:
#   eagle_config.return_hidden_post_norm, or top-level norm_output: the hidden state fed back at
#       draft steps >= 2 is norm(h) instead of the pre-norm h. (A flat config's top-level norm_output is
#       SpecForge's field with another meaning, see draft_producers; the bundle never writes it.)
#   eagle_config.norm_before_fc: input_norm = RMSNorm(A*T) over the concatenated aux states before fc.
#   top-level fc_norm: one RMSNorm(T) per aux chunk before fc; wins over norm_before_fc.
#   eagle_config.eh_proj_before_attn: h = eh_proj(cat[enorm(embeds), h]) at every step, and the layer
#       becomes "regular" (no input_layernorm, q/k/v read H, not 2H). eagle_config.eh_proj_bias: its bias.
#   eagle_config.next_layer_regular: only changes layers after the first of a multi-layer draft
#       (single-layer drafts: _next_layer_regular = eh_proj_before_attn), so it is carried, not used.
#   top-level bias: fc has a bias (an fc.bias tensor without it is not loaded).
# Fields of eagle_config TensorRT-LLM does not read (use_input_layernorm_in_first_layer,
# use_last_layernorm, parallel_draft_step, ...) are carried in ``extra`` and change nothing.
NESTED_FLAGS = ("return_hidden_post_norm", "norm_before_fc", "eh_proj_before_attn", "eh_proj_bias")
TOP_LEVEL_FLAGS = ("fc_norm", "bias")


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
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
    extra: dict[str, Any] = field(default_factory=dict)
    # TensorRT-LLM variant flags (see NESTED_FLAGS / TOP_LEVEL_FLAGS above)
    return_hidden_post_norm: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    eh_proj_before_attn: bool = False
    eh_proj_bias: bool = False
    fc_bias: bool = False
    # the aux-layer ids in the order the config lists them, when that is not ascending: every producer
    # and TensorRT-LLM concatenate the aux states in ascending layer order, so fc's blocks are not permuted
    aux_layer_ids_as_listed: tuple[int, ...] | None = None
    # decoder layers (TensorRT-LLM's midlayer.{i} when more than one; layers >= 1 are "regular")
    num_hidden_layers: int = 1
    # speculators' sliding window over the draft's attention (draft_producers.sliding_window), or None
    sliding_window: int | None = None
    # the config leaves the aux layers to the serving engine's default (missing, or null as speculators'
    # converter writes it): draft_producers documents that vLLM and TensorRT-LLM then agree
    aux_layer_ids_missing: str | None = None
    # the file's own numbering of the aux ids: file id = TensorRT-LLM id + aux_id_offset (speculators
    # counts vLLM's inputs of layers: 1; the others count outputs of layers: 0), for messages that quote the file
    aux_id_offset: int = 0

    def aux_ids_in_file(self, ids: tuple[int, ...] | list[int]) -> str:
        """``ids`` (TensorRT-LLM's numbering) as the config file writes them, TensorRT-LLM's beside them where they differ."""
        if not self.aux_id_offset:
            return str(list(ids))
        return f"{[i + self.aux_id_offset for i in ids]} (TensorRT-LLM's layer outputs {list(ids)}: the file counts inputs of layers, vLLM's numbering)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def own_embedding(self) -> bool:
        """TensorRT-LLM gives the draft its own embed_tokens exactly when target_hidden_size differs
        from hidden_size; otherwise it shares the target's, whatever the checkpoint ships
        (Eagle3DraftModel.__init__ and Eagle3ForCausalLM.load_weights_from_target_model)."""
        return self.target_hidden_size != self.hidden_size

    @property
    def fuse_width(self) -> int:
        return max(self.num_aux_layers, 1) * self.target_hidden_size

    def rope(self, where: str = "config.json") -> rope_params.RopeParams:
        return rope_params.from_config(self.rope_theta, self.rope_scaling, self.head_dim, self.max_position_embeddings, where=where)


def detect_format(cfg: dict[str, Any], names: set[str], cfg_path: Path | str = "config.json") -> str:
    draft_producers.refuse_other_method(cfg, Path(cfg_path))
    if _is_speculators(cfg):
        return "speculators"
    if any(n.startswith("midlayer.") for n in names):
        return "safeailab"
    if any(n.startswith("layers.0.") for n in names) or "eagle_config" in cfg:
        return "modelopt"
    raise UserError(
        "draft",
        "not an EAGLE-3 head: no midlayer.* or layers.0.* tensors and no speculators config",
        "pass the directory of an EAGLE-3 draft (SafeAILab, ModelOpt or speculators layout)",
    )


def read_draft_config(path: Path) -> DraftConfig:
    """A head's config alone, for dry runs that read no weights: the same parsing as ``load_draft``
    (speculators' nested layer config and vLLM aux ids included), with the two facts weights would
    give taken from the config: the aux count (listed ids, else TensorRT-LLM's default three) and the
    draft vocabulary (``draft_vocab_size``, else ``vocab_size``). Aux ids come out sorted, as
    ``load_draft`` serves them."""
    path = Path(path)
    raw = read_json(path / "config.json")
    names = safetensors_names(path)  # the layout as load_draft detects it, where headers can tell
    if names:
        fmt = detect_format(raw, names, path / "config.json")
    else:
        draft_producers.refuse_other_method(raw, path / "config.json")
        fmt = "speculators" if _is_speculators(raw) else ("modelopt" if "eagle_config" in raw else "safeailab")
    return draft_config(raw, path / "config.json", fmt, None)


def _is_speculators(raw: dict[str, Any]) -> bool:
    # speculators 0.9 writes architectures ["Eagle3DraftModel"], earlier releases ["Eagle3Speculator"]
    archs = raw.get("architectures") or []
    return raw.get("speculators_model_type") == "eagle3" or "Eagle3Speculator" in archs or "Eagle3DraftModel" in archs


def draft_config(raw: dict[str, Any], cfg_path: Path, fmt: str, tensors: dict[str, Any] | None) -> DraftConfig:
    """The normalized DraftConfig of a head's config.json in layout ``fmt``; ``tensors`` (renamed to
    the SafeAILab names) supply the aux count and draft vocabulary where present, None for config-only."""
    base, aux, extra, flags = _speculators_layout(raw, cfg_path) if fmt == "speculators" else _eagle_layout(raw, cfg_path)
    _refuse_unsupported(base, cfg_path)
    window = draft_producers.sliding_window(base) if fmt == "speculators" else None
    missing = _aux_missing(raw, fmt, aux, cfg_path)

    # the same strict schema validate and engine apply to the target: "256" is refused in one line,
    # not coerced by int() here and met as a different answer elsewhere. pad_token_id is left out:
    # an EAGLE-3 head never pads, and some heads carry -1 there.
    fields = parse_config({k: v for k, v in base.items() if k != "pad_token_id"}, cfg_path, Eagle3DraftConfigFields)
    _refuse_partial_rotary(base, fields.head_size, cfg_path)
    num_layers = fields.num_hidden_layers
    if num_layers < 1:
        raise UserError(f"{cfg_path}:num_hidden_layers", f"{num_layers} draft decoder layers", "an EAGLE-3 head has at least one layer")
    if num_layers > 1 and flags.get("eh_proj_before_attn"):
        raise UserError(
            f"{cfg_path}:num_hidden_layers",
            f"{num_layers} layers with eagle_config.eh_proj_before_attn: every layer is then regular in TensorRT-LLM",
            "the reference runtime implements multi-layer heads whose first layer reads cat(embeds, hidden)",
        )
    if num_layers > 1 and extra.get("next_layer_regular") is False:
        raise UserError(
            f"{cfg_path}:eagle_config.next_layer_regular",
            f"false with {num_layers} layers: TensorRT-LLM would feed cat(embeds, hidden) to every layer",
            "the reference runtime implements TensorRT-LLM's default (later layers regular); drop the field",
        )

    hidden = fields.hidden_size
    heads = fields.num_attention_heads
    vocab = fields.vocab_size
    theta, scaling = _rope_of(base, cfg_path)
    target_hidden, n_aux, dvs = _head_counts(fields, aux, tensors)
    return DraftConfig(
        hidden_size=hidden,
        intermediate_size=fields.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=fields.kv_heads,
        head_dim=fields.head_size,
        rms_norm_eps=fields.rms_norm_eps if fields.rms_norm_eps is not None else 1e-6,
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=fields.max_position_embeddings or DEFAULT_MAX_POSITIONS,
        vocab_size=vocab,
        draft_vocab_size=int(dvs),
        target_hidden_size=target_hidden,
        # a set of layers: every producer concatenates them in ascending order (draft_producers)
        aux_layer_ids=tuple(sorted(int(i) for i in aux)) if aux is not None else None,
        aux_layer_ids_as_listed=tuple(int(i) for i in aux) if aux is not None and list(aux) != sorted(aux) else None,
        aux_layer_ids_missing=missing,
        aux_id_offset=1 if fmt == "speculators" else 0,
        num_hidden_layers=num_layers,
        sliding_window=window,
        num_aux_layers=n_aux,
        torch_dtype=dtype_of(base),
        source_format=fmt,
        attention_bias=fields.attention_bias,
        mlp_bias=fields.mlp_bias,
        extra=extra,
        # speculators' norm_output is TensorRT-LLM's return_hidden_post_norm (see draft_producers)
        return_hidden_post_norm=flags.get("return_hidden_post_norm", False) or flags.get("norm_output", False),
        norm_before_fc=flags.get("norm_before_fc", False),
        fc_norm=flags.get("fc_norm", False),
        eh_proj_before_attn=flags.get("eh_proj_before_attn", False),
        eh_proj_bias=flags.get("eh_proj_bias", False),
        fc_bias=flags.get("bias", False),
    )


def layer_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A draft config.json's decoder-layer config: speculators' layouts (EAGLE-3 and its other methods) nest it under
    ``transformer_layer_config`` (with the vocabulary and target width beside it); others are flat."""
    layer_cfg = raw.get("transformer_layer_config")
    if not isinstance(layer_cfg, dict):
        return raw
    return {**layer_cfg, **{k: raw[k] for k in ("draft_vocab_size", "target_hidden_size") if k in raw}}


def _speculators_layout(raw: dict[str, Any], cfg_path: Path) -> tuple[dict[str, Any], Any, dict[str, Any], dict[str, bool]]:
    """(layer config, aux ids in TensorRT-LLM's numbering, extra, flags) of a speculators eagle3 config."""
    layer_cfg = raw.get("transformer_layer_config")
    if not isinstance(layer_cfg, dict):
        raise UserError(f"{cfg_path}:transformer_layer_config", "missing or not an object", "a speculators eagle3 config nests the Llama layer config there")
    draft_producers.speculators_refusals(raw, layer_cfg, cfg_path)
    base = layer_config(raw)
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    if aux is not None:
        if min(aux) < 1:
            raise UserError(
                f"{cfg_path}:eagle_aux_hidden_state_layer_ids",
                f"{aux} captures the embeddings (vLLM id 0)",
                "TensorRT-LLM captures decoder-layer outputs only; retrain with ids >= 1",
            )
        aux = [i - 1 for i in aux]  # vLLM: input of layer i == TensorRT-LLM: output of layer i-1
    extra: dict[str, Any] = {}  # norm_before_residual true is refused above
    # speculators trains these top-level flags with TensorRT-LLM's meaning and tensor names
    # (vllm-project/speculators 0.9.0 models/eagle3/core.py: input_norm over the concatenated aux
    # states, fc_norm.{i} per chunk, norm_output feeds the post-norm state back), so they are
    # carried, not dropped: dropping them would serve and measure another function.
    flags = {k: _flag(raw, k, f"{cfg_path}:{k}") for k in ("norm_before_fc", "fc_norm", "norm_output")}
    return base, aux, extra, flags


def _aux_missing(raw: dict[str, Any], fmt: str, aux: Any, cfg_path: Path) -> str | None:
    """Where a config leaves the aux layers to the serving engine (None when it lists them)."""
    if aux is not None:
        return None
    if fmt == "speculators":
        if "eagle_aux_hidden_state_layer_ids" in raw:
            return f"{cfg_path}:eagle_aux_hidden_state_layer_ids is null (speculators' converter writes null unless given the ids)"
        return f"{cfg_path}:eagle_aux_hidden_state_layer_ids is missing"
    return None  # SafeAILab/SpecForge heads are trained on the default layers, their configs never list them


def _eagle_layout(raw: dict[str, Any], cfg_path: Path) -> tuple[dict[str, Any], Any, dict[str, Any], dict[str, bool]]:
    """(layer config, aux ids, extra, flags) of a SafeAILab / ModelOpt config (options under eagle_config)."""
    base = raw
    eagle_cfg = raw.get("eagle_config") or {}
    if not isinstance(eagle_cfg, dict):
        raise UserError(f"{cfg_path}:eagle_config", "is not an object", "eagle_config is a JSON object of EAGLE options")
    aux = eagle_cfg.get("eagle_aux_hidden_state_layer_ids", raw.get("eagle_aux_hidden_state_layer_ids"))
    extra = {k: eagle_cfg[k] for k in ("next_layer_regular",) if k in eagle_cfg}
    flags = {k: _flag(eagle_cfg, k, f"{cfg_path}:eagle_config.{k}") for k in NESTED_FLAGS}
    flags.update({k: _flag(raw, k, f"{cfg_path}:{k}") for k in TOP_LEVEL_FLAGS})
    draft_producers.specforge_norm_output(raw, cfg_path)  # SpecForge's final-norm flag: true is the standard head
    return base, aux, extra, flags


def _refuse_unsupported(base: dict[str, Any], cfg_path: Path) -> None:
    """Draft architectures the reference runtime does not implement, refused by the field that names them."""
    if base.get("kv_lora_rank"):
        raise UserError(
            f"{cfg_path}:kv_lora_rank", "an MLA (DeepSeek-style) EAGLE-3 head", "the reference runtime implements the Llama-style Eagle3 draft only"
        )
    if base.get("model_type") == "llama4_text":
        raise UserError(f"{cfg_path}:model_type", "llama4_text EAGLE-3 heads are not implemented", "use a Llama-style head")


def _refuse_partial_rotary(base: dict[str, Any], head_dim: int, cfg_path: Path) -> None:
    """TensorRT-LLM's Eagle3Attention takes ``RopeParams.from_config(draft config)`` (modeling_speculative.py @
    b35ac1b64368513d215c57d2ed01d62d910df8da), so the draft's rotary dim follows the same precedence as a Llama
    target's (rope_params.rotary_dim_of); the reference runtime's draft (core/draft.py, and the trainer) rotates
    the whole head, so a head whose config gives a smaller dim is refused rather than measured as another function."""
    dim, key = rope_params.rotary_dim_of(trtllm_view(base), head_dim, "rope_params", str(cfg_path))
    if dim != head_dim:
        raise UserError(
            f"{cfg_path}:{key}",
            f"{base.get(key)!r}: TensorRT-LLM's Eagle3 draft would rotate the first {dim} of {head_dim} channels of each head (partial rotary)",
            "the reference runtime's EAGLE-3 draft implements full rotary only; remove the key if the head was trained with full rotary",
        )


def _rope_of(base: dict[str, Any], cfg_path: Path) -> tuple[Any, Any]:
    theta, scaling = rope_of(base)
    if scaling is not None and not isinstance(scaling, dict):
        raise UserError(f"{cfg_path}:rope_scaling", f"{scaling!r} is not an object", "rope_scaling is a JSON object or null")
    # TensorRT-LLM reads a top-level original_max_position_embeddings first (RopeParams.from_config)
    return rope_params.effective_scaling(base, str(cfg_path))


def _head_counts(fields: Eagle3DraftConfigFields, aux: Any, tensors: dict[str, Any] | None) -> tuple[int, int, Any]:
    """(target hidden size, number of aux layers fc fuses, draft vocabulary size): from the tensors where
    present, else from the config and TensorRT-LLM's defaults."""
    norm = tensors if tensors is not None else {}
    hidden = fields.hidden_size
    vocab = fields.vocab_size
    fc = norm.get("fc.weight")
    target_hidden = fields.target_hidden_size or hidden
    if tensors is None:
        n_aux = len(aux) if aux is not None else EAGLE3_DEFAULT_NUM_AUX
    else:
        n_aux = (fc.shape[1] // target_hidden) if fc is not None and target_hidden else 0
    dvs = fields.draft_vocab_size
    if dvs is None:
        lm = norm.get("lm_head.weight")
        dvs = lm.shape[0] if lm is not None else vocab
    return target_hidden, n_aux, dvs


def _flag(cfg: dict[str, Any], key: str, where: str) -> bool:
    v = cfg.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        # TensorRT-LLM tests truthiness: "false" would switch the variant on
        raise UserError(where, f"{v!r} is not true/false", "write a JSON boolean")
    return v


def expected_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor TensorRT-LLM's Eagle3 draft loads for this config, with its shape."""
    H, T, A = cfg.hidden_size, cfg.target_hidden_size, max(cfg.num_aux_layers, 1)
    dims = {
        "H": H,
        "2H": H if cfg.eh_proj_before_attn else 2 * H,  # a "regular" layer's q/k/v read H
        "T": T,
        "AT": A * T,
        "Q": cfg.num_attention_heads * cfg.head_dim,
        "K": cfg.num_key_value_heads * cfg.head_dim,
        "I": cfg.intermediate_size,
        "D": cfg.draft_vocab_size,
    }
    out = {k: tuple(dims[d] for d in v) for k, v in {**LAYER_SCHEMA, **HEAD_SCHEMA}.items()}
    if cfg.num_hidden_layers > 1:
        # TensorRT-LLM's midlayer.{i} (Eagle3DraftModel: a ModuleList); layers >= 1 are regular: no
        # input_layernorm, q/k/v read H
        first = {k.replace("midlayer.", "midlayer.0."): v for k, v in out.items() if k.startswith("midlayer.")}
        regular = {k: (v[0], H) if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")) else v for k, v in first.items()}
        del regular["midlayer.0.input_layernorm.weight"]
        out = {k: v for k, v in out.items() if not k.startswith("midlayer.")} | first
        for i in range(1, cfg.num_hidden_layers):
            out |= {k.replace("midlayer.0.", f"midlayer.{i}."): v for k, v in regular.items()}
    if cfg.eh_proj_before_attn:
        del out["midlayer.input_layernorm.weight"]
        out["enorm.weight"] = (H,)
        out["eh_proj.weight"] = (H, 2 * H)
        if cfg.eh_proj_bias:
            out["eh_proj.bias"] = (H,)
    if cfg.fc_bias:
        out["fc.bias"] = (H,)
    if cfg.fc_norm:
        out.update({f"fc_norm.{i}.weight": (T,) for i in range(A)})
    elif cfg.norm_before_fc:
        out["input_norm.weight"] = (A * T,)
    if cfg.own_embedding:
        out["embed_tokens.weight"] = (cfg.vocab_size, H)
    return out


def trtllm_config(cfg: DraftConfig, token_ids: dict[str, Any], max_seq_len: int | None = None) -> dict[str, Any]:
    """config.json for the exported draft: the flat SafeAILab layout TensorRT-LLM's Eagle3 loader reads.

    ``token_ids``: the target's config (``target_token_ids``): the draft config's bos/eos are the target's,
    not what the head's config says (speculators' nested layer config and ModelOpt carry defaults there).

    ``max_seq_len``: the bundle's. TensorRT-LLM, vLLM and SGLang size the draft's rope table by its
    ``max_position_embeddings`` (vLLM crashes past it: vllm-project/vllm issue 48894; SGLang refuses
    longer contexts by default: sgl-project/sglang PRs 9388 and 10787), so it is raised to at least
    ``max_seq_len`` where that leaves the rotary function unchanged (rope_params.MAX_POS_INDEPENDENT,
    with original_max_position_embeddings written out explicitly).
    """
    rp = cfg.rope()
    max_pos = cfg.max_position_embeddings
    if max_seq_len is not None and max_seq_len > max_pos and rp.kind in rope_params.MAX_POS_INDEPENDENT:
        max_pos = int(max_seq_len)
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": max_pos,
        "rope_theta": cfg.rope_theta,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    scaling = rope_params.export_scaling(rp, cfg.rope_scaling)
    if scaling is not None:
        out["rope_scaling"] = scaling
    if cfg.fc_bias:
        out["bias"] = True
    if cfg.fc_norm:
        out["fc_norm"] = True
    eagle = dict(cfg.extra)
    for k in NESTED_FLAGS:
        if getattr(cfg, k):
            eagle[k] = True
    if cfg.aux_layer_ids is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)
    if eagle:
        out["eagle_config"] = eagle
    out.update(target_token_ids(token_ids))
    return rope_block.normalised(out, where="draft config.json")  # the one rope block every bundle config carries


def target_token_ids(target_cfg: dict[str, Any]) -> dict[str, Any]:
    """The bos/eos ids a bundle's draft config.json carries: the target's."""
    return {k: target_cfg[k] for k in ("bos_token_id", "eos_token_id") if target_cfg.get(k) is not None}
