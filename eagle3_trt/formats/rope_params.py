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
from eagle3_trt.formats.hf_compat import rope_of

# TensorRT-LLM's RotaryScalingType names; "none" covers a missing rope_scaling and "default".
TRTLLM_TYPES = ("none", "linear", "dynamic", "longrope", "llama3", "yarn", "mrope")
# What the reference runtime computes (mrope is multimodal-only and never a Llama draft's).
RUNTIME_TYPES = ("none", "linear", "dynamic", "llama3", "yarn", "longrope")
# Types whose TensorRT-LLM function does not depend on max_position_embeddings once
# original_max_position_embeddings is written explicitly: raising max_position_embeddings in an
# exported config leaves them unchanged (dynamic's threshold and longrope's mscale do depend on it).
MAX_POS_INDEPENDENT = ("none", "linear", "llama3", "yarn")
# TensorRT-LLM's default when neither the config nor rope_scaling names it (RopeParams.from_config).
DEFAULT_ORIGINAL_MAX_POSITIONS = 1024


@dataclass(frozen=True)
class RopeParams:
    kind: str
    theta: float
    dim: int
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


def scaling_kind(scaling: dict[str, Any] | None) -> str:
    """TensorRT-LLM's ``RotaryScalingType.from_string(rope_scaling.get("type") or rope_scaling.get("rope_type"))``
    as a name ("type" wins over "rope_type", matching is case-insensitive). Unknown names are returned
    lower-cased; ``check_supported`` refuses them."""
    if not scaling:
        return "none"
    s = scaling.get("type") or scaling.get("rope_type")
    if s is None:
        return "none"
    key = str(s).lower()
    return "none" if key == "default" else key


def _num(v: Any, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UserError(f"{where}:rope_scaling.{key}", f"{v!r} is not a number", "fix the rope_scaling block of config.json")
    return float(v)


def from_config(
    theta: float,
    scaling: dict[str, Any] | None,
    head_dim: int,
    max_position_embeddings: int,
    top_level: dict[str, Any] | None = None,
    where: str = "config.json",
) -> RopeParams:
    """RopeParams.from_config on an already split config (theta, rope_scaling dict, head_dim).

    ``top_level``: the config.json's own keys TensorRT-LLM reads besides rope_scaling
    (``original_max_position_embeddings``, which wins over the dict's, and ``max_seq_len``).
    """
    top = top_level or {}
    kind = scaling_kind(scaling)
    sc = scaling or {}
    if kind not in TRTLLM_TYPES:
        raise UserError(
            f"{where}:rope_scaling",
            f"rope type {kind!r} is not one TensorRT-LLM accepts ({', '.join(TRTLLM_TYPES[1:])})",
            "TensorRT-LLM would refuse this config (Unsupported rotary scaling type); fix rope_scaling",
        )
    kw: dict[str, Any] = {}
    if scaling:
        kw = dict(
            factor=_num(sc.get("factor", 1.0), where, "factor"),
            alpha=_num(sc.get("alpha", 1.0) if sc.get("alpha") is not None else 1.0, where, "alpha"),
            low_freq_factor=_num(sc.get("low_freq_factor", 1.0), where, "low_freq_factor"),
            high_freq_factor=_num(sc.get("high_freq_factor", 4.0), where, "high_freq_factor"),
            original_max_positions=int(
                top.get("original_max_position_embeddings") or sc.get("original_max_position_embeddings") or DEFAULT_ORIGINAL_MAX_POSITIONS
            ),
            beta_fast=_num(sc.get("beta_fast", 32), where, "beta_fast"),
            beta_slow=_num(sc.get("beta_slow", 1), where, "beta_slow"),
            mscale=_num(sc.get("mscale", 1.0), where, "mscale"),
            mscale_all_dim=_num(sc.get("mscale_all_dim", 0.0), where, "mscale_all_dim"),
        )
        for key in ("short_factor", "long_factor"):
            if key in sc:
                vals = sc[key]
                if not isinstance(vals, (list, tuple)) or len(vals) != head_dim // 2:
                    raise UserError(f"{where}:rope_scaling.{key}", f"expected a list of {head_dim // 2} numbers", "one factor per rotary frequency")
                kw[key] = tuple(_num(v, where, key) for v in vals)
    msl = top.get("max_seq_len")
    return RopeParams(
        kind=kind,
        theta=float(theta),
        dim=int(head_dim),
        max_positions=int(max_position_embeddings),
        max_seq_len=int(msl) if isinstance(msl, int) else None,
        **kw,
    )


def from_raw_config(cfg: dict[str, Any], where: str = "config.json") -> RopeParams:
    """RopeParams of a flat Llama config.json dict (either transformers spelling, see hf_compat.rope_of)."""
    theta, scaling = rope_of(cfg)
    heads = cfg.get("num_attention_heads") or 1
    head_dim = cfg.get("head_dim")
    if not isinstance(head_dim, int):
        head_dim = int(cfg.get("hidden_size") or 0) // int(heads)
    if scaling is not None and not isinstance(scaling, dict):
        raise UserError(f"{where}:rope_scaling", f"{scaling!r} is not an object", "rope_scaling is a JSON object or null")
    return from_config(theta, scaling, head_dim, int(cfg.get("max_position_embeddings") or 0), top_level=cfg, where=where)


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
            f"longrope table has {max(p.max_positions, p.original_max_positions)} rows, max_seq_len is {max_seq_len}",
            "TensorRT-LLM's longrope scale depends on max_position_embeddings, so it cannot be raised; lower --max-seq-len",
        )


def describe(p: RopeParams) -> str:
    """A short human form, used in validate's report and the mismatch warning."""
    s = f"rope_theta {p.theta:g}, {p.kind}"
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
    to 1024, transformers to max_position_embeddings, so an implicit value means two functions).
    None for plain rope."""
    if p.kind == "none":
        return None
    out = dict(source or {})
    if p.kind in ("llama3", "yarn", "longrope"):
        out["original_max_position_embeddings"] = p.original_max_positions
    return out
