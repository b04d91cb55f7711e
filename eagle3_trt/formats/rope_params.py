"""Rotary-embedding parameters of a Llama-family config, read the way TensorRT-LLM reads them.

TensorRT-LLM is the ground truth: what the reference runtime measures must be what it serves.
Sources (NVIDIA/TensorRT-LLM):

- ``tensorrt_llm/_torch/attention/backends/interface.py`` @ 1262edbc3809b30af94c3cf2ec2736a14642b821:
  ``RopeParams.from_config`` (which fields, which defaults) and ``create_rope_const_params``
  (yarn -> ``create_sinusoidal_positions_yarn``, longrope -> ``create_sinusoidal_positions_long_rope``,
  everything else -> ``create_sinusoidal_positions_for_attention_plugin``).
- ``RotaryScalingType`` / ``RopeEmbeddingUtils`` (tensorrt_llm/functional.py; the 2026 version read
  through the search index, id 57079567367; 0071496dc625910229bf433821453636ef3770eb for the older one):
  ``none, linear, dynamic, longrope, llama3, yarn, mrope``; ``None`` and (newer releases only)
  ``"default"`` mean none; anything else raises ``Unsupported rotary scaling type``.
- The fused attention kernels (cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/*,
  unfusedAttentionKernels/*: ``update_rotary_base_n_scale``) recompute ``dynamic`` at run time:
  the base becomes ``theta * (factor * L / max_positions - (factor - 1)) ** (dim / (dim - 2))``
  only once the sequence length L exceeds ``max_position_embeddings``; below that it is plain rope.

This module only parses and checks (it is imported by ``validate`` without torch); the tables are
computed in ``eagle3_trt.core.rope``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import Family
from eagle3_trt.formats.hf_compat import flat_rope_parameters, rope_of, trtllm_view
from eagle3_trt.formats.hf_compat import scaling_kind as scaling_kind  # the one type/rope_type resolver, re-exported

# TensorRT-LLM's RotaryScalingType names; "none" covers a missing rope_scaling and "default".
TRTLLM_TYPES = ("none", "linear", "dynamic", "longrope", "llama3", "yarn", "mrope")
# What the reference runtime computes (mrope is multimodal-only and never a Llama draft's).
RUNTIME_TYPES = ("none", "linear", "dynamic", "llama3", "yarn", "longrope")
# Types whose TensorRT-LLM function does not depend on max_position_embeddings once
# original_max_position_embeddings is written explicitly: raising max_position_embeddings in an
# exported config leaves them unchanged (dynamic's threshold and longrope's mscale do depend on it).
MAX_POS_INDEPENDENT = ("none", "linear", "llama3", "yarn")
# Types whose function uses original_max_position_embeddings (TensorRT-LLM and transformers alike).
SCALED_BY_ORIGINAL = ("llama3", "yarn", "longrope")
# TensorRT-LLM's default when neither the config nor rope_scaling names it (RopeParams.from_config).
DEFAULT_ORIGINAL_MAX_POSITIONS = 1024


@dataclass(frozen=True)
class RopeParams:
    kind: str
    theta: float
    dim: int  # the rotary dim: the first ``dim`` channels of each head rotate (GPT-NeoX halves within them)
    max_positions: int
    factor: float = 1.0
    alpha: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = DEFAULT_ORIGINAL_MAX_POSITIONS
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    max_seq_len: int | None = None
    # the attention head's size where it is larger than ``dim`` (partial rotary: the rest pass through)
    head_dim: int | None = None

    @property
    def partial(self) -> bool:
        return self.head_dim is not None and self.head_dim != self.dim


def _num(v: Any, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UserError(f"{where}:rope_scaling.{key}", f"{v!r} is not a number", "fix the rope_scaling block of config.json")
    return float(v)


def original_max_of(top: dict[str, Any], scaling: dict[str, Any] | None, where: str = "config.json") -> tuple[int, str | None]:
    """(value, the key it came from; None: TensorRT-LLM's default) of ``original_max_position_embeddings``
    as ``RopeParams.from_config`` takes it: the top-level config attribute first, then rope_scaling's,
    else 1024 (``getattr(config, ...) or rope_scaling.get(...) or 1024``: interface.py @
    51ea5c963794a4818ad8396a77d147fa901435d9; ``top`` is ``hf_compat.trtllm_view`` of the config, where a
    transformers-5 rope_parameters value has already overwritten the top-level one)."""
    for key, src in (("original_max_position_embeddings", top), ("rope_scaling.original_max_position_embeddings", scaling or {})):
        v = src.get("original_max_position_embeddings")
        if v:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UserError(f"{where}:{key}", f"{v!r} is not a positive integer", "original_max_position_embeddings is the pre-training context length")
            return v, key
    return DEFAULT_ORIGINAL_MAX_POSITIONS, None


# The config keys RopeParams.from_config reads for the rotary dim, in its order (first truthy wins):
#   rotary_dim or rotary_emb_base or qk_rope_head_dim or int(head_dim * (rotary_pct or partial_rotary_factor or 1.0))
# (interface.py @ 000a01de66f0eab4ab05640711f0253f50f5209c and @ 51ea5c963794a4818ad8396a77d147fa901435d9).
DIM_KEYS = ("rotary_dim", "rotary_emb_base", "qk_rope_head_dim")
PCT_KEYS = ("rotary_pct", "partial_rotary_factor")


def _rope_params_dim(top: dict[str, Any], head_dim: int, where: str) -> tuple[int, str]:
    """(rotary dim, the key that decided it) by RopeParams.from_config's precedence."""
    for key in DIM_KEYS:
        v = top.get(key)
        if not v:
            continue
        if key == "rotary_emb_base":
            # Qwen-1 configs mean the rope *theta* by it; TensorRT-LLM would rotate that many channels
            raise UserError(
                f"{where}:rotary_emb_base",
                f"{v!r}: TensorRT-LLM reads rotary_emb_base as the rotary dim (RopeParams.from_config), while configs that carry it mean the rope theta",
                "write the theta as rope_theta and remove rotary_emb_base",
            )
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"{where}:{key}", f"{v!r} is not an integer", "the rotary dim is a number of channels per head")
        return v, key
    for key in PCT_KEYS:
        v = top.get(key)
        if v:
            return int(head_dim * _pct(v, where, key)), key
    return head_dim, "head_dim"


def _pct(v: Any, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UserError(f"{where}:{key}", f"{v!r} is not a number", "the fraction of each head that rotates, in (0, 1]")
    return float(v)


def _check_dim(dim: int, head_dim: int, where: str, key: str) -> None:
    if dim <= 0 or dim % 2 or dim > head_dim:
        raise UserError(
            f"{where}:{key}",
            f"gives a rotary dim of {dim} for head_dim {head_dim}",
            "rope rotates channel pairs of the head: the rotary dim must be even, positive and at most head_dim",
        )


def rotary_dim_of(top: dict[str, Any], head_dim: int, rule: str, where: str = "config.json") -> tuple[int, str]:
    """(rotary dim, the config key that decided it) as TensorRT-LLM's model for ``rule`` computes it
    (``Family.rotary_dim_rule``; ``top`` is ``hf_compat.trtllm_view`` of the config):

    - ``rope_params`` (Llama, the EAGLE-3 draft): ``RopeParams.from_config``'s precedence (DIM_KEYS, then
      PCT_KEYS). ``rotary_emb_base`` is refused: it is the theta where configs carry it.
    - ``partial_rotary_factor`` (Qwen3): the default fused QK-norm+RoPE path rotates
      ``int(head_dim * partial_rotary_factor)`` channels and reads no other key
      (QKNormRoPEAttention.apply_qk_norm_rope, qk_norm_attention.py @ 034c3f0a0d1d5d90e5567c8d953019bdf5243b77);
      a config whose other keys would give the generic path another dim is refused (the two paths disagree).
    - ``head_dim`` (gpt-oss): ``RopeParams(dim=head_dim)`` whatever the config says (modeling_gpt_oss.py @
      7924c7f1d3b4a3286b62c13fc890900295dc39cb builds it by hand); a partial-rotary config is refused, since
      TensorRT-LLM would silently serve a full-rotary model the checkpoint was not trained as.
    """
    generic, key = _rope_params_dim(top, head_dim, where)
    if rule == "rope_params":
        _check_dim(generic, head_dim, where, key)
        return generic, key
    if rule == "partial_rotary_factor":
        dim, fkey = head_dim, "head_dim"
        if "partial_rotary_factor" in top:
            fkey = "partial_rotary_factor"
            if top[fkey] is None:
                raise UserError(
                    f"{where}:{fkey}", "null", "TensorRT-LLM's Qwen3 attention computes int(head_dim * partial_rotary_factor); remove the key or write a number"
                )
            dim = int(head_dim * _pct(top[fkey], where, fkey))
        _check_dim(dim, head_dim, where, fkey)
        if generic != dim:
            raise UserError(
                f"{where}:{key}",
                f"{top.get(key)!r} gives TensorRT-LLM's generic rope a rotary dim of {generic}, but its Qwen3 fused QK-norm+RoPE "
                f"kernel (the default) rotates {dim} channels: it reads partial_rotary_factor only",
                f"spell Qwen3 partial rotary as partial_rotary_factor and remove {key}",
            )
        return dim, fkey
    if rule == "head_dim":
        if generic != head_dim:
            raise UserError(
                f"{where}:{key}",
                f"{top.get(key)!r}: partial rotary ({generic} of {head_dim} channels), but TensorRT-LLM's gpt-oss builds "
                "RopeParams(dim=head_dim) and silently rotates the whole head, so it would serve a model this checkpoint "
                "was not trained as",
                "gpt-oss rotates the whole head; this checkpoint cannot be served faithfully by TensorRT-LLM",
            )
        return head_dim, "head_dim"
    raise ValueError(f"unknown rotary dim rule {rule!r}")


def from_config(
    theta: float,
    scaling: dict[str, Any] | None,
    head_dim: int,
    max_position_embeddings: int,
    top_level: dict[str, Any] | None = None,
    where: str = "config.json",
    rotary_dim: int | None = None,
) -> RopeParams:
    """RopeParams.from_config on an already split config (theta, rope_scaling dict, head_dim).

    ``top_level``: the config.json's own keys TensorRT-LLM reads besides rope_scaling
    (``original_max_position_embeddings``, which wins over the dict's, and ``max_seq_len``).
    ``rotary_dim``: ``rotary_dim_of``'s answer where it is not the whole head.
    """
    top = top_level or {}
    dim = int(rotary_dim or head_dim)
    kind = scaling_kind(scaling)
    sc = scaling or {}
    if kind not in TRTLLM_TYPES:
        raise UserError(
            f"{where}:rope_scaling",
            f"rope type {kind!r} is not one TensorRT-LLM accepts ({', '.join(TRTLLM_TYPES[1:])})",
            "TensorRT-LLM would refuse this config (Unsupported rotary scaling type); fix rope_scaling",
        )
    if "type" in sc and not sc["type"] and sc.get("rope_type") and kind != "none":
        # transformers 4.57 (TensorRT-LLM 1.2's) copies type over rope_type when loading, so TensorRT-LLM then
        # reads no type at all; transformers 5 keeps rope_type, which TensorRT-LLM then reads: two answers
        raise UserError(
            f"{where}:rope_scaling.type",
            f"{sc['type']!r} while rope_type is {sc['rope_type']!r}: TensorRT-LLM reads {kind} under transformers 5 and plain rope "
            "under transformers 4.57 (which copies type over rope_type)",
            "remove the empty type key",
        )
    kw: dict[str, Any] = {}
    if scaling:
        kw = dict(
            factor=_num(sc.get("factor", 1.0), where, "factor"),
            alpha=_num(sc.get("alpha", 1.0) if sc.get("alpha") is not None else 1.0, where, "alpha"),
            low_freq_factor=_num(sc.get("low_freq_factor", 1.0), where, "low_freq_factor"),
            high_freq_factor=_num(sc.get("high_freq_factor", 4.0), where, "high_freq_factor"),
            original_max_positions=original_max_of(top, sc, where)[0],
            beta_fast=_num(sc.get("beta_fast", 32), where, "beta_fast"),
            beta_slow=_num(sc.get("beta_slow", 1), where, "beta_slow"),
            mscale=_num(sc.get("mscale", 1.0), where, "mscale"),
            mscale_all_dim=_num(sc.get("mscale_all_dim", 0.0), where, "mscale_all_dim"),
        )
        for key in ("short_factor", "long_factor"):
            if key in sc:
                vals = sc[key]
                if not isinstance(vals, (list, tuple)) or len(vals) != dim // 2:
                    raise UserError(f"{where}:rope_scaling.{key}", f"expected a list of {dim // 2} numbers", "one factor per rotary frequency")
                kw[key] = tuple(_num(v, where, key) for v in vals)
    msl = top.get("max_seq_len")
    return RopeParams(
        kind=kind,
        theta=float(theta),
        dim=dim,
        max_positions=int(max_position_embeddings),
        max_seq_len=int(msl) if isinstance(msl, int) else None,
        head_dim=int(head_dim) if dim != head_dim else None,
        **kw,
    )


# Keys a config may spell both at the top level (transformers 4.57's spelling) and inside rope_parameters
# (transformers 5's). Which one a served model uses depends on the release: TensorRT-LLM 1.2 runs on
# transformers 4.57, whose config classes keep rope_parameters as an unread attribute, and its
# RopeParams.from_config reads the top-level attributes only (interface.py @
# 000a01de66f0eab4ab05640711f0253f50f5209c); releases since PR #10636 (2026-01-14) first merge rope_parameters
# over the top level (``config.update(hf_rope_parameters)``, interface.py search-index id 55427064947), and
# transformers 5 (TensorRT-LLM 1.3.0rc15 and later pin 5.5.x) builds rope_parameters from rope_scaling when
# both are given and lets rope_parameters' own rope_theta / partial_rotary_factor win over the top level's
# (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict, transformers/modeling_rope_utils.py, 5.14.1).
SPELLED_TWICE = ("rope_theta", "partial_rotary_factor", "original_max_position_embeddings")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return bool(a == b)


def _disagree(where: str, key_a: str, a: Any, key_b: str, b: Any, served: str) -> UserError:
    return UserError(
        f"{where}:{key_a}",
        f"{a!r}, but {key_b} is {b!r}: {served}",
        f"write one value in both places (the one the model was trained with), or remove {key_a}",
    )


def check_agreement(cfg: dict[str, Any], where: str = "config.json") -> None:
    """Refuse (one line naming both fields and both values) a config whose rope is spelled twice with two
    values: each TensorRT-LLM release would serve one of them, and the reference runtime would measure one.
    Checked: the top-level rope_theta / partial_rotary_factor / original_max_position_embeddings against
    rope_parameters' and (original_max_position_embeddings) rope_scaling's, and rope_scaling against
    rope_parameters entry by entry (type as TensorRT-LLM resolves it). A value spelled once is no conflict."""
    params = flat_rope_parameters(cfg)
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else None
    for key in SPELLED_TWICE:
        if cfg.get(key) is None:
            continue
        for name, block in (("rope_parameters", params), ("rope_scaling", scaling)):
            if block is not None and block.get(key) is not None and not _same(cfg[key], block[key]):
                raise _disagree(
                    where,
                    key,
                    cfg[key],
                    f"{name}.{key}",
                    block[key],
                    "TensorRT-LLM 1.2 (transformers 4.57 ignores rope_parameters) serves the top-level value, releases on "
                    f"transformers 5 the one in {name}" + (", from which transformers 5 builds rope_parameters" if name == "rope_scaling" else ""),
                )
    if scaling is None or params is None or scaling_kind(params) == "none":
        # a plain block beside rope_scaling (what transformers 5 writes for a config without scaling: rope_theta and
        # "default") names no second function: every reader scales by rope_scaling, transformers 5 rebuilding
        # rope_parameters from it; its rope_theta was compared above
        return
    both = "transformers 5 keeps rope_scaling's and drops rope_parameters', readers of rope_parameters take the other"
    if scaling_kind(scaling) != scaling_kind(params):
        key = "type" if scaling.get("type") else "rope_type"
        raise _disagree(where, f"rope_scaling.{key}", scaling.get(key), "rope_parameters' type", scaling_kind(params), both)
    for key in sorted((set(scaling) & set(params)) - {"type", "rope_type"}):
        if not _same(scaling[key], params[key]):
            raise _disagree(where, f"rope_scaling.{key}", scaling[key], f"rope_parameters.{key}", params[key], both)


def from_raw_config(cfg: dict[str, Any], where: str = "config.json", family: Family | None = None) -> RopeParams:
    """RopeParams of a config.json dict (either transformers spelling, see hf_compat.rope_of) as TensorRT-LLM's
    model of ``family`` builds them (None: RopeParams.from_config's rules, as Llama and the EAGLE-3 draft):
    scaling type, original_max_position_embeddings and rotary dim all decided here. A config whose two
    spellings disagree is refused first (``check_agreement``)."""
    check_agreement(cfg, where)
    theta, scaling = rope_of(cfg)
    return from_attributes(cfg, theta, scaling, where, family)


def from_attributes(
    cfg: dict[str, Any], theta: float, scaling: Any, where: str = "config.json", family: Family | None = None, *, merge: bool = True
) -> RopeParams:
    """RopeParams as TensorRT-LLM's model of ``family`` builds them from a config's attributes: ``theta`` and
    ``scaling`` as the config object holds them, the other keys read from ``cfg`` (after merging rope_parameters
    over them where ``merge``: TensorRT-LLM releases since PR #10636; see ``check_agreement``). ``from_raw_config``
    and ``rope_releases`` (a config as one release's transformers loads it) both end here."""
    given = cfg.get("head_dim")
    if family is not None:
        head_dim = family.head_dim(cfg)
    elif isinstance(given, int):
        head_dim = given
    else:
        head_dim = int(cfg.get("hidden_size") or 0) // int(cfg.get("num_attention_heads") or 1)
    if scaling is not None and not isinstance(scaling, dict):
        raise UserError(f"{where}:rope_scaling", f"{scaling!r} is not an object", "rope_scaling is a JSON object or null")
    if family is not None and family.position_type_from_scaling and scaling is not None:
        _check_position_type(scaling, family, where)
    top = _top_level(cfg, family, merge)
    dim, _ = rotary_dim_of(top, head_dim, family.rotary_dim_rule if family is not None else "rope_params", where)
    return from_config(theta, scaling, head_dim, int(cfg.get("max_position_embeddings") or 0), top_level=top, where=where, rotary_dim=dim)


# PositionEmbeddingType names a rope_scaling type may take (the rest raise "Unsupported position embedding type")
POSITION_TYPES = ("yarn", "mrope", "default")


def _check_position_type(scaling: dict[str, Any], family: Family, where: str) -> None:
    """Qwen3Attention reads the type a second time, as a PositionEmbeddingType, letting ``type`` win on key
    presence (``if "type" in rope_scaling``) where RopeParams lets it win when truthy; it raises on names that are
    no PositionEmbeddingType (llama3, linear, dynamic, longrope) and on a block with neither key."""
    if "type" in scaling:
        key, name = "type", scaling["type"]
    elif "rope_type" in scaling:
        key, name = "rope_type", scaling["rope_type"]
    else:
        raise UserError(f"{where}:rope_scaling", "has neither type nor rope_type", f"TensorRT-LLM's {family.name} attention raises on it; name the rope type")
    kind = scaling_kind(scaling)
    if name not in POSITION_TYPES or (kind != "none" and name != kind):
        raise UserError(
            f"{where}:rope_scaling.{key}",
            f"{name!r}: TensorRT-LLM's {family.name} attention parses it as a position embedding type"
            + (f" (while its rope tables use {kind!r})" if name != kind and kind != "none" else "")
            + f" and accepts only {', '.join(POSITION_TYPES)}",
            f"a {family.name} target served by TensorRT-LLM uses yarn or plain rope, named by one type key",
        )


def _top_level(cfg: dict[str, Any], family: Family | None, merge: bool = True) -> dict[str, Any]:
    """The top-level keys TensorRT-LLM reads next to rope_scaling. gpt-oss builds its RopeParams by hand from
    rope_scaling alone (``original_max_positions=rope_scaling['original_max_position_embeddings']``,
    modeling_gpt_oss.py @ 7924c7f1d3b4a3286b62c13fc890900295dc39cb), so a top-level value does not count there."""
    top = trtllm_view(cfg) if merge else cfg
    if family is not None and family.rotary_dim_rule == "head_dim":
        top = {k: v for k, v in top.items() if k != "original_max_position_embeddings"}
    return top


def effective_scaling(cfg: dict[str, Any], where: str = "config.json", family: Family | None = None) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) of a config.json dict with ``original_max_position_embeddings`` written into
    the block where TensorRT-LLM takes it from the top level (``original_max_of``): readers that keep
    only (theta, scaling), such as TargetInfo and the draft config, then carry the value TensorRT-LLM uses."""
    check_agreement(cfg, where)
    theta, scaling = rope_of(cfg)
    if isinstance(scaling, dict) and scaling_kind(scaling) in SCALED_BY_ORIGINAL:
        value, key = original_max_of(_top_level(cfg, family), scaling, where)
        if key == "original_max_position_embeddings":
            scaling = {**scaling, "original_max_position_embeddings": value}
    return theta, scaling


# Types whose transformers function (what the reference runtime's target runs) can differ from
# TensorRT-LLM's beyond float rounding; the target's rotary tables are replaced for them.
HF_DIFFERS = ("yarn", "longrope")


def check_supported(p: RopeParams, where: str, max_seq_len: int | None = None) -> None:
    """Refuse (one line) what the reference runtime cannot compute exactly as TensorRT-LLM does."""
    if p.kind not in RUNTIME_TYPES:
        raise UserError(
            f"{where}:rope_scaling",
            f"rope type {p.kind!r} is not implemented in the reference runtime",
            f"EAGLE-3 Llama heads use one of {', '.join(RUNTIME_TYPES)}",
        )
    if p.dim % 2 or p.dim <= 0:
        raise UserError(f"{where}:head_dim", f"{p.dim} is not a positive even number", "rotary embeddings need an even head_dim")
    if p.partial and p.kind == "dynamic":
        # the reference runtime's partial-rotary tables are TensorRT-LLM's python table; dynamic is
        # rescaled inside the fused kernels instead, for which no partial-rotary source was checked
        raise UserError(f"{where}:rope_scaling", "dynamic rope with partial rotary", "not measurable: use full rotary or another rope type")
    if p.theta <= 0:
        raise UserError(f"{where}:rope_theta", f"{p.theta:g} must be positive", "fix the config")
    if p.kind in ("linear", "llama3", "yarn") and p.factor <= 0:
        raise UserError(f"{where}:rope_scaling.factor", f"{p.factor:g} must be positive", "fix rope_scaling")
    if p.kind == "llama3" and p.low_freq_factor == p.high_freq_factor:
        raise UserError(f"{where}:rope_scaling", "llama3 low_freq_factor equals high_freq_factor", "TensorRT-LLM asserts they differ")
    if p.kind == "longrope" and (p.short_factor is None or p.long_factor is None):
        raise UserError(f"{where}:rope_scaling", "longrope needs short_factor and long_factor", "fix rope_scaling")
    if p.kind == "dynamic":
        # Two TensorRT-LLM paths disagree when alpha != 1: the python table uses Hunyuan's
        # alpha-NTK base, the fused kernels the length-dependent NTK base (module docstring).
        if p.alpha != 1.0:
            raise UserError(
                f"{where}:rope_scaling.alpha",
                f"dynamic rope with alpha {p.alpha:g}",
                "TensorRT-LLM's attention backends compute alpha-scaled dynamic rope differently; not measurable",
            )
        if max_seq_len is not None and max_seq_len > p.max_positions:
            raise UserError(
                f"{where}:rope_scaling",
                f"dynamic rope with max_seq_len {max_seq_len} > max_position_embeddings {p.max_positions}",
                "TensorRT-LLM rescales the base per sequence length past that point, which the reference runtime "
                f"does not model; build with --max-seq-len <= {p.max_positions}",
            )
    if p.kind == "longrope" and max_seq_len is not None and max_seq_len > max(p.max_positions, p.original_max_positions):
        raise UserError(
            f"{where}:max_position_embeddings",
            f"longrope table has {max(p.max_positions, p.original_max_positions)} rows (max_position_embeddings {p.max_positions}, "
            f"original_max_position_embeddings {p.original_max_positions}), max_seq_len is {max_seq_len}",
            "TensorRT-LLM's longrope scale depends on max_position_embeddings, so it cannot be raised; lower --max-seq-len",
        )


def describe(p: RopeParams) -> str:
    """A short human form, used in validate's report and the mismatch warning."""
    s = f"rope_theta {p.theta:g}, {p.kind}"
    if p.partial:
        s += f", rotary dim {p.dim} of head_dim {p.head_dim}"
    if p.kind in ("linear", "llama3", "yarn"):
        s += f" factor {p.factor:g}"
    if p.kind in ("llama3", "yarn", "longrope"):
        s += f", original_max_position_embeddings {p.original_max_positions}"
    return s


def same_function(a: RopeParams, b: RopeParams) -> bool:
    """Whether two configs give the same rotary function (max_position_embeddings only matters
    where the function depends on it: dynamic's threshold, longrope's scale)."""
    if (a.kind, a.theta, a.dim) != (b.kind, b.theta, b.dim):
        return False
    if a.kind == "none":
        return True
    skip = {"max_seq_len"} | (set() if a.kind in ("dynamic", "longrope") else {"max_positions"})
    return all(getattr(a, f) == getattr(b, f) for f in a.__dataclass_fields__ if f not in skip)


def export_scaling(p: RopeParams, source: dict[str, Any] | None) -> dict[str, Any] | None:
    """The rope_scaling block for an exported config: the source block with
    original_max_position_embeddings written out where the function uses it (TensorRT-LLM defaults it
    to 1024, transformers to max_position_embeddings, so an implicit value means two functions), and the
    type under ``rope_type`` alone, as ``scaling_kind`` resolved it (a stale ``type`` beside it would be read
    by TensorRT-LLM but not by transformers 5). None for plain rope."""
    if p.kind == "none":
        return None
    out = {k: v for k, v in (source or {}).items() if k != "type"}
    out["rope_type"] = p.kind
    if p.kind in SCALED_BY_ORIGINAL:
        out["original_max_position_embeddings"] = p.original_max_positions
    return out
