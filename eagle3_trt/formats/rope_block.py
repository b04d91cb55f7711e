"""The one rope block every bundle config.json carries (target and draft, whatever ``--quant``).

Every writer of a bundle's config.json (``convert/export.py`` for fp8/nvfp4 through ModelOpt, bf16 and native
copies, the dry run in ``pipeline/build_checkpoints.py``, the draft's ``formats/draft_config.trtllm_config``)
ends with ``normalised``. It takes the rope the reference runtime measures (``rope_params.from_raw_config``
of the *source* config: TensorRT-LLM's rules, after ``check_agreement`` has refused a config spelling one
value twice with two values) and writes it out in every spelling with the same values, all keys explicit:

- ``rope_theta`` at the top level (transformers 4.57 would otherwise default it to 10000);
- ``rope_scaling`` with the type under ``rope_type`` alone and every key transformers 4.57 requires
  (llama3's original_max_position_embeddings, low/high_freq_factor; factor), so TensorRT-LLM 1.2 loads it;
- ``rope_parameters`` holding the same values plus rope_theta (and partial_rotary_factor where the model
  rotates part of the head), so transformers 5 and TensorRT-LLM's merge of it change nothing;
- the top-level keys TensorRT-LLM 1.2 reads (``partial_rotary_factor``, ``rotary_pct``, ``rotary_dim``,
  ``original_max_position_embeddings``) where the source had them, with the value used.

``rope_releases`` reads the result as each release does; tests/test_rope_block.py checks that every
release, and the installed transformers' ``AutoConfig``, read back the function that was measured.
"""

from __future__ import annotations

from typing import Any

from eagle3_trt.formats.families import Family
from eagle3_trt.formats.hf_compat import dtype_of, flat_rope_parameters, trtllm_view
from eagle3_trt.formats.rope_params import SCALED_BY_ORIGINAL, effective_scaling, export_scaling, from_raw_config

# Top-level keys the block owns: a writer's own values for them are replaced by the block's.
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "original_max_position_embeddings", "partial_rotary_factor", "rotary_pct", "rotary_dim")
# Rotary-dim keys TensorRT-LLM reads at the top level (rope_params.DIM_KEYS / PCT_KEYS that configs carry)
_DIM_KEYS = ("partial_rotary_factor", "rotary_pct", "rotary_dim")


def rope_block(source: dict[str, Any], where: str = "config.json", family: Family | None = None) -> dict[str, Any]:
    """The rope keys of ``source`` (a config.json dict) normalised; refuses what ``from_raw_config`` refuses."""
    p = from_raw_config(source, where, family)
    _, scaling = effective_scaling(source, where, family)
    block: dict[str, Any] = {"rope_theta": p.theta}
    sc = export_scaling(p, scaling)
    if sc is not None:
        sc.pop("rope_theta", None)
        sc.pop("partial_rotary_factor", None)
        if p.kind in ("linear", "dynamic", "llama3", "yarn"):
            sc["factor"] = sc.get("factor", p.factor)
        if p.kind == "llama3":
            sc["low_freq_factor"] = sc.get("low_freq_factor", p.low_freq_factor)
            sc["high_freq_factor"] = sc.get("high_freq_factor", p.high_freq_factor)
        block["rope_scaling"] = sc
    view = trtllm_view(source)
    for key in _DIM_KEYS:
        if view.get(key) is not None:
            block[key] = view[key]
    if p.kind in SCALED_BY_ORIGINAL and source.get("original_max_position_embeddings") is not None:
        block["original_max_position_embeddings"] = p.original_max_positions
    params = {"rope_type": p.kind if sc is not None else "default", "rope_theta": p.theta, **{k: v for k, v in (sc or {}).items() if k != "rope_type"}}
    if "partial_rotary_factor" in block:
        params["partial_rotary_factor"] = block["partial_rotary_factor"]
    nested = source.get("rope_parameters")
    if isinstance(nested, dict) and nested and flat_rope_parameters(source) is not nested:
        block["rope_parameters"] = {layer_type: dict(params) for layer_type in nested}  # keyed by layer type, as the source
    else:
        block["rope_parameters"] = params
    return block


def normalised(cfg: dict[str, Any], source: dict[str, Any] | None = None, where: str = "config.json", family: Family | None = None) -> dict[str, Any]:
    """``cfg`` (what a writer is about to save) with the rope block of ``source`` (default: ``cfg`` itself)
    in place of its own rope keys, and the dtype under both spellings (``torch_dtype``: 4.57, ``dtype``: 5)."""
    block = rope_block(source if source is not None else cfg, where, family)
    out = {k: v for k, v in cfg.items() if k not in ROPE_KEYS}
    out.update(block)
    dt = dtype_of(cfg)
    if dt is not None:
        out["torch_dtype"] = dt
    return out
