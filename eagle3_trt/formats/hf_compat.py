"""The transformers adapter, config half: the ``config.json`` field spellings that differ between
the two transformers generations this toolkit meets, each with the versions it covers and why.

The generations: **4.57** (4.57.3 is what TensorRT-LLM 1.2's containers ship; ``make test-compat``
runs the suite on it) and **5.x** (what a plain ``pip install`` gets; ``make test``). The other half
(attention, KV caches, tokenizers: code that runs transformers objects) is ``eagle3_trt.core.hf_compat``;
code outside these two modules calls transformers only through APIs that are the same in both.

Config readers (validate, plan, recommend, the CLI's start-up) use these helpers, so this module
imports neither torch nor transformers: reading a config must not cost their seconds of import.
"""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------------------------
# config.json field spellings
# ---------------------------------------------------------------------------------------------
# transformers 5 writes ``rope_parameters`` (rope_theta and the scaling in one dict) and ``dtype``;
# transformers 4.57 only reads ``rope_theta``, ``rope_scaling`` and ``torch_dtype``
# (transformers/configuration_utils.py and models/llama/configuration_llama.py of each release).
# A Llama-3 config exported on a plain machine without the legacy keys would load in the
# container with the default rope_theta of 10000 instead of 500000: no error, just wrong
# attention. Every config this toolkit writes carries both spellings, with one set of values
# (``formats/rope_block.normalised``).


def scaling_kind(scaling: Any) -> str:
    """The rope scaling type of a rope_scaling / rope_parameters block as TensorRT-LLM resolves it: the
    one function every reader of ``type`` / ``rope_type`` goes through (validate, the runtime's rope,
    the bundle's draft config).

    Both keys exist because transformers renamed ``type`` to ``rope_type``; a config may carry both,
    disagreeing. TensorRT-LLM's ``RopeParams.from_config`` reads
    ``rope_scaling.get("type") or rope_scaling.get("rope_type")`` (``type`` wins whenever it is truthy:
    tensorrt_llm/_torch/attention_backend/interface.py @ 51ea5c963794a4818ad8396a77d147fa901435d9 and
    000a01de66f0eab4ab05640711f0253f50f5209c), then ``RotaryScalingType.from_string`` lower-cases the
    name and maps ``"default"`` to none. Returned lower-cased, ``"none"`` for plain rope; an unknown
    name is returned as is and refused by ``rope_params.from_config``."""
    if not isinstance(scaling, dict) or not scaling:
        return "none"
    s = scaling.get("type") or scaling.get("rope_type")
    if s is None:
        return "none"
    key = str(s).lower()
    return "none" if key == "default" else key


def trtllm_view(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config's top-level keys as TensorRT-LLM's ``RopeParams.from_config`` sees them in releases since
    PR #10636 (2026-01-14): a transformers-5 ``rope_parameters`` block is merged into the config first
    (``config.update(hf_rope_parameters)``, its ``full_attention`` entry when it is keyed by layer type),
    overwriting top-level keys of the same name: interface.py, newest version (search-index id 55427064947).
    TensorRT-LLM 1.2 (transformers 4.57) reads no rope_parameters; a config where the two views differ by a
    value spelled twice is refused (``rope_params.check_agreement``), and one spelled in rope_parameters only
    is written out at the top level too in every bundle (``rope_block``), so measured and served agree."""
    params = flat_rope_parameters(cfg)
    return cfg if params is None else {**cfg, **params}


def flat_rope_parameters(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The config's rope_parameters as one dict (the ``full_attention`` entry where it is keyed by layer
    type, as TensorRT-LLM takes it), or None where it has none."""
    params = cfg.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        return None
    if all(isinstance(v, dict) for v in params.values()):
        inner = params.get("full_attention") or next(iter(params.values()))
        return inner if isinstance(inner, dict) else None
    return params


def rope_of(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling or None) from either spelling; theta defaults to HF's 10000."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params and scaling_kind(params) != "none":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and scaling_kind(scaling) == "none":
        scaling = None
    return float(theta), scaling


def dtype_of(cfg: dict[str, Any]) -> str | None:
    """The checkpoint dtype: ``torch_dtype`` (4.57 and older) or ``dtype`` (5.x)."""
    return cfg.get("torch_dtype") or cfg.get("dtype")
