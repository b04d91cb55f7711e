"""Config fields that differ between the two transformers generations users run.

transformers 5 writes ``rope_parameters`` and ``dtype``; transformers 4.57 (inside
TensorRT-LLM 1.2 containers) only reads ``rope_theta``, ``rope_scaling`` and
``torch_dtype``. A Llama-3 config exported on a plain machine without the legacy keys
would load in the container with the default rope_theta of 10000 instead of 500000:
no error, just wrong attention. Every config this toolkit writes carries both spellings.
"""

from __future__ import annotations

from typing import Any


def rope_of(cfg: dict[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from either spelling; theta defaults to HF's 10000."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(theta), scaling


def dtype_of(cfg: dict[str, Any]) -> str | None:
    return cfg.get("torch_dtype") or cfg.get("dtype")


def with_legacy_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """A copy of cfg that both transformers generations read the same way."""
    out = dict(cfg)
    theta, scaling = rope_of(cfg)
    out["rope_theta"] = theta
    if scaling is not None:
        out["rope_scaling"] = scaling
    dt = dtype_of(cfg)
    if dt is not None:
        out["torch_dtype"] = dt
    return out
