"""A config.json's rope as one TensorRT-LLM release serves it: first as that release's transformers loads the
file into a config object, then as its ``RopeParams.from_config`` reads that object.

Two transformers generations load the file differently (both read in their source and checked against the
installed transformers by tests/test_rope_block.py):

- **4.57** (TensorRT-LLM 1.2.x and 1.3.0rc4..rc14 pin 4.57.1/4.57.3: the ``Requires-Dist`` of each release's
  sdist on PyPI). Every key of the file becomes an attribute as written; ``rope_parameters`` is one more
  attribute nothing reads. ``rope_theta`` defaults to the config class's value. ``LlamaConfig.__init__``
  copies ``type`` over ``rope_type`` and ``rope_config_validation`` raises ``KeyError`` for a block lacking
  its type's required keys (llama3: factor, original_max_position_embeddings, low_freq_factor,
  high_freq_factor): models/llama/configuration_llama.py and modeling_rope_utils.py ``_check_received_keys``,
  transformers 4.57.3.
- **5.x** (TensorRT-LLM 1.3.0rc15 and later pin 5.5.x). ``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``
  builds ``rope_parameters`` from ``rope_scaling`` when the file has one (else from ``rope_parameters``),
  fills ``rope_theta`` and ``partial_rotary_factor`` from the top level only where the block lacks them,
  ``standardize_rope_params`` fills ``rope_type`` from ``type`` (else "default") and, for llama3/yarn/longrope,
  ``original_max_position_embeddings`` from ``max_position_embeddings`` (not from a top-level value: the
  Llama-family config classes do not declare that attribute); ``rope_scaling`` is then a property returning
  ``rope_parameters`` and ``rope_theta`` is no attribute; a block lacking its type's required keys raises
  ``KeyError`` here too (transformers/modeling_rope_utils.py, 5.14.1; tests/test_rope_block.py's loader tests
  also pass on 5.5.4, the pin of TensorRT-LLM 1.3.0rc22+ and 1.4, run with its wheel first on PYTHONPATH).

TensorRT-LLM's ``RopeParams.from_config`` then reads the attributes (interface.py): 1.2.x reads the top level
and ``rope_scaling`` only (@ 000a01de66f0eab4ab05640711f0253f50f5209c); releases after PR #10636 (merged
2026-01-14, so every 5.x release and some 4.57 ones) first do ``config.update(rope_parameters)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import Family
from eagle3_trt.formats.hf_compat import flat_rope_parameters
from eagle3_trt.formats.hf_config import max_positions_of
from eagle3_trt.formats.rope_params import SCALED_BY_ORIGINAL, RopeParams, describe, from_attributes, same_function

# The config classes' rope_theta default where the file has none (configuration_<model>.py, 4.57.3 and 5.x).
DEFAULT_THETA = {"gpt_oss": 150000.0}
HF_DEFAULT_THETA = 10000.0

# transformers 4.57's required rope_scaling keys per type (modeling_rope_utils.py _validate_*: 4.57.3)
REQUIRED_4_57: dict[str, frozenset[str]] = {
    "default": frozenset({"rope_type"}),
    "linear": frozenset({"rope_type", "factor"}),
    "dynamic": frozenset({"rope_type", "factor"}),
    "yarn": frozenset({"rope_type", "factor"}),
    "longrope": frozenset({"rope_type", "short_factor", "long_factor"}),
    "llama3": frozenset({"rope_type", "factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
}
# transformers 5's, checked after standardize_rope_params has filled rope_type, rope_theta and the original length
# (RotaryEmbeddingConfigMixin._validate_*_rope_parameters / _check_received_keys raise KeyError: 5.14.1)
REQUIRED_5: dict[str, frozenset[str]] = {
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "yarn": frozenset({"factor"}),
    "longrope": frozenset({"short_factor", "long_factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor"}),
}


@dataclass(frozen=True)
class Reader:
    """How one TensorRT-LLM release reads a config: its transformers generation, and whether its
    ``RopeParams.from_config`` merges rope_parameters first (None: not pinned down for this release; both
    readings must then agree)."""

    transformers: str  # "4.57" or "5"
    merges: bool | None
    label: str


def _theta_default(cfg: dict[str, Any]) -> float:
    return DEFAULT_THETA.get(str(cfg.get("model_type")), HF_DEFAULT_THETA)


def attributes_4_57(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The config object's attributes as transformers 4.57 loads ``cfg`` (see the module docstring); a
    file it refuses raises UserError naming the missing keys."""
    attrs = copy.deepcopy(cfg)
    if attrs.get("rope_theta") is None:
        attrs["rope_theta"] = _theta_default(cfg)
    rs = attrs.get("rope_scaling")
    if isinstance(rs, dict):
        if "type" in rs:
            rs["rope_type"] = rs["type"]
        kind = str(rs.get("rope_type", rs.get("type", "default")))
        required = REQUIRED_4_57.get(kind)
        missing = sorted(required - set(rs)) if required is not None else []
        if missing:
            raise _missing(where, missing, "4.57", kind, "rope_scaling")
    return attrs


def _missing(where: str, missing: list[str], generation: str, kind: str, block: str) -> UserError:
    return UserError(
        f"{where}:{block}",
        f"has no {', '.join(missing)}: transformers {generation} raises KeyError loading this config ({kind} rope needs them), "
        "so TensorRT-LLM on it cannot load the model",
        f"write {', '.join(missing)} into {block}",
    )


def attributes_5(cfg: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """The config object's attributes as transformers 5 loads ``cfg`` (see the module docstring); a file it
    refuses raises UserError naming the missing keys."""
    attrs = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
    source = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    params: dict[str, Any] = copy.deepcopy(source) if isinstance(source, dict) else {}
    nested = bool(params) and all(isinstance(v, dict) for v in params.values())
    entries = list(params.values()) if nested else [params]
    theta = cfg["rope_theta"] if cfg.get("rope_theta") is not None else _theta_default(cfg)
    for entry in entries:
        entry.setdefault("rope_theta", theta)
        if cfg.get("partial_rotary_factor") is not None:
            entry.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
        entry.setdefault("rope_type", entry.get("type", "default"))
        if entry["rope_type"] in SCALED_BY_ORIGINAL:
            entry.setdefault("original_max_position_embeddings", max_positions_of(cfg))
        missing = sorted(REQUIRED_5.get(str(entry["rope_type"]), frozenset()) - set(entry))
        if missing:
            raise _missing(where, missing, "5", str(entry["rope_type"]), "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters")
    attrs["rope_parameters"] = params
    attrs["rope_scaling"] = params
    return attrs


def served(cfg: dict[str, Any], reader: Reader, where: str, family: Family | None) -> list[RopeParams]:
    """The rope ``reader``'s release serves for ``cfg`` (two readings where its merge is not pinned down)."""
    attrs = attributes_4_57(cfg, where) if reader.transformers == "4.57" else attributes_5(cfg, where)
    out = []
    for merge in (False, True) if reader.merges is None else (reader.merges,):
        view = dict(attrs)
        if merge:
            flat = flat_rope_parameters(attrs)
            if flat is not None:
                view.update(flat)
        theta = float(view.get("rope_theta") or HF_DEFAULT_THETA)
        scaling = view.get("rope_scaling")
        out.append(from_attributes(view, theta, scaling if scaling else None, where, family, merge=False))
    return out


def check_release(cfg: dict[str, Any], measured: RopeParams, reader: Reader, where: str, family: Family | None) -> None:
    """Refuse a config that ``reader``'s release would load as another rope than ``measured`` (or not load)."""
    for p in served(cfg, reader, where, family):
        if not same_function(p, measured):
            raise UserError(
                f"{where}:rope",
                f"{reader.label} (transformers {reader.transformers}) serves {describe(p)}; the reference runtime measured {describe(measured)}",
                "rebuild the bundle with `eagle3-trt engine` (it writes one rope block every release reads alike), or undo the hand edit",
            )
